"""The optional C part of the recorder (:mod:`dl2._speedups`, built from
``src/dl2/_speedups.c`` where a C compiler is found at install).

It runs two of the recorder's steps faster for their common case, over the same state
as the Python code, which it falls back to for everything else.  ``DL2_PURE_PYTHON=1``
turns it off (the tests run the recorder both ways); :func:`active` says whether this
process uses it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def module() -> ModuleType | None:
    """:mod:`dl2._speedups`, or None where it was not built or ``DL2_PURE_PYTHON`` is set."""
    if os.environ.get("DL2_PURE_PYTHON"):
        return None
    try:
        return importlib.import_module("dl2._speedups")
    except ImportError:
        return None


def active() -> bool:
    """Whether the recorder runs its C steps in this process."""
    return module() is not None
