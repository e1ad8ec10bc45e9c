"""The dl2 command line (placeholder until the commands land)."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dl2`` console script."""
    return 2
