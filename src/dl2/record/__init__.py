"""The recorder: runs inside every rank and appends its communication to a trace file.

``install()`` is all a process needs (``dl2 run`` arranges it through the bootstrap
``sitecustomize``): afterwards every gloo process group the job creates is a recording
one.  Importing this package imports neither torch nor any dl2 analysis dependency;
torch is imported by :func:`install`.

Environment:
    DL2_RUN_DIR: the trace directory (install() does nothing without it).
    DL2_DISABLE: "1" turns recording off.
"""

from __future__ import annotations

from dl2.record.install import ENV_DISABLE
from dl2.record.install import install
from dl2.record.install import is_installed
from dl2.record.install import uninstall
from dl2.record.writer import ENV_RUN_DIR

__all__ = ["ENV_DISABLE", "ENV_RUN_DIR", "install", "is_installed", "uninstall"]
