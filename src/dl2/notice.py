"""One line on stderr from dl2, never an exception: ``dl2: <message>``.

The recorder calls it inside the user's ranks, where stderr may be closed or a broken
pipe; a notice that cannot be written is dropped rather than disturbing the job.
"""

from __future__ import annotations

import sys


def notice(message: str) -> None:
    """Print ``dl2: message`` on stderr and flush; drop it if stderr is unusable."""
    try:
        print(f"dl2: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
