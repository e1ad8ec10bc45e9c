"""Faults that make live verdicts untrustworthy: a full trace directory, a lost write.

Either way ranks may have stopped recording, so the monitor stops live detection and
the traces are analysed after the job ends (post-mortem).  Other faults degrade less:
a truncated record is read when complete, a dead rank is an exited rank whose waits
are orphaned, a lost store (multi-node) means local-only analysis.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dl2.live.tailer import TraceTailer
from dl2.trace.session import ALIVE

#: a trace file that ends in a partial line this long, its rank alive, lost a write
PARTIAL_WRITE_S = 2.0


def recording_fault(
    run_dir: Path,
    tailer: TraceTailer,
    local: Mapping[int, str],
    now: float,
    low_space_bytes: int,
) -> str | None:
    """Why ranks may have stopped recording, or None.

    Args:
        run_dir: the trace directory (its free space).
        tailer: the traces read so far (partial last lines).
        local: this node's rank -> process state (only live ranks can lose a write).
        now: ``time.monotonic()``.
        low_space_bytes: less free space than this is a fault.
    """
    try:
        stat = os.statvfs(run_dir)
        free = stat.f_bavail * stat.f_frsize
    except OSError:
        free = None
    if free is not None and free < low_space_bytes:
        return f"the trace directory is nearly full ({free // 1024} KiB free)"
    partial = {
        r: s for r, s in tailer.stuck_partial(now, PARTIAL_WRITE_S).items() if local.get(r) == ALIVE
    }
    if partial:
        rank = min(partial)
        return f"rank {rank}'s trace has ended in a partial record for {partial[rank]:.0f} s"
    return None
