"""Following a launched job with the live monitor, as ``dl2 run`` and ``dl2 replay`` do."""

from __future__ import annotations

import signal
from types import FrameType

from dl2.live.monitor import Monitor
from dl2.live.monitor import Outcome


def watch_job(monitor: Monitor) -> Outcome:
    """Run ``monitor`` until its job ends or a verdict stops it.

    Meanwhile SIGTERM is turned into KeyboardInterrupt, so that a terminated dl2 stops
    the job and still reports; whatever of the job still runs at the end is stopped.
    """
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return monitor.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not monitor.job.finished():
            monitor.job.stop()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
