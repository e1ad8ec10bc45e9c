"""Following a launched job with the live monitor, as ``dl2 run`` and ``dl2 replay`` do."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from dl2.live.monitor import Monitor
from dl2.live.monitor import Outcome

#: signals that stop the job and still report: Ctrl-C, kill, a closed terminal or ssh
#: session, Ctrl-\ (torchrun's agent stops its workers on the same ones)
STOP_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    if hasattr(signal, name)
)


_depth = 0  # stop_signals() entered and not left (an inner one changes nothing)


@contextmanager
def stop_signals(last: bool = False) -> Iterator[None]:
    """While inside: the first of :data:`STOP_SIGNALS` raises one KeyboardInterrupt, the
    later ones are ignored, so an interrupted dl2 stops the job and still writes its
    report (a second Ctrl-C while it concludes changes nothing).  Nested: only the
    outermost one handles them.  ``last``: the process ends right after (the command
    line): once one came, they stay ignored instead of restored, so that a second one
    landing while the interpreter shuts down cannot kill it and change its exit status."""
    global _depth
    if _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    interrupted = False

    def interrupt(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    _depth = 1
    try:
        yield
    finally:
        _depth = 0
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if last and interrupted else handler)


def watch_job(monitor: Monitor) -> Outcome:
    """Run ``monitor`` until its job ends or a verdict stops it (inside
    :func:`stop_signals`: a stop signal stops the job and still reports).  Whatever of
    the job still runs at the end is stopped."""
    try:
        with stop_signals():
            return monitor.run()
    finally:
        if not monitor.job.finished():
            monitor.job.stop()
