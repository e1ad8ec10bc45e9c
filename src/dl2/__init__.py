"""dl2: find communication deadlocks in distributed PyTorch jobs.

The recorder (:mod:`dl2.record`) runs inside every rank and writes one trace file per
rank; :func:`dl2.load` reads a run directory back and :func:`dl2.analyze` turns it into a
:class:`dl2.Report` of findings.  Heavy modules are imported lazily so that the recorder,
which imports this package inside every rank, stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from dl2._version import __version__
from dl2.errors import Dl2Error

if TYPE_CHECKING:
    from dl2.report import Report
    from dl2.trace.session import Session

__all__ = ["Dl2Error", "Report", "Session", "__version__", "analyze", "load"]


def load(run_dir: str) -> Session:
    """Load every rank's trace file of a run directory into a :class:`Session`."""
    from dl2.trace.session import load_session

    return load_session(run_dir)


def analyze(session: Session, **options: Any) -> Report:
    """Run all analyses over a session and return the report."""
    from dl2.analysis import analyze as _analyze

    return _analyze(session, **options)


def __getattr__(name: str) -> Any:
    if name == "Report":
        from dl2.report import Report

        return Report
    if name == "Session":
        from dl2.trace.session import Session

        return Session
    raise AttributeError(name)
