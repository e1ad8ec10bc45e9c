"""Following a launched job with the live monitor, as ``dl2 run`` and ``dl2 replay`` do."""

from __future__ import annotations

import signal
from types import FrameType

from dl2.live.monitor import Monitor
from dl2.live.monitor import Outcome


def watch_job(monitor: Monitor) -> Outcome:
    """Run ``monitor`` until its job ends or a verdict stops it.

    Meanwhile SIGINT and SIGTERM are turned into one KeyboardInterrupt, so that an
    interrupted dl2 stops the job and still reports: a second Ctrl-C while it stops the
    job and analyses is ignored.  Whatever of the job still runs at the end is stopped.
    """
    interrupted = False

    def interrupt(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return monitor.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not monitor.job.finished():
            monitor.job.stop()
