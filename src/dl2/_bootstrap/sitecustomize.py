"""dl2's bootstrap: installs the recorder in every Python process of a job.

``dl2 run`` puts this directory first on ``PYTHONPATH`` and sets ``DL2_RUN_DIR``, so
Python imports this module at start-up (``site`` imports ``sitecustomize``) in the
launcher, in every torchrun worker and in every ``torch.multiprocessing.spawn`` child.

It imports nothing heavy: it adds an import hook that calls ``dl2.record.install()``
once both ``torch`` and ``torch.distributed`` have finished importing, i.e. before the
user's code can create a process group.  ``DL2_DISABLE=1`` turns it off.  Then it runs
the ``sitecustomize`` this one shadows, if there is one further along ``sys.path``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_WATCHED = ("torch", "torch.distributed")


def _notice(message: str) -> None:
    try:
        print(f"dl2: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _ready() -> bool:
    """True once torch and torch.distributed are both fully imported."""
    for name in _WATCHED:
        module = sys.modules.get(name)
        if module is None:
            return False
        spec = getattr(module, "__spec__", None)
        if spec is not None and getattr(spec, "_initializing", False):
            return False
    return True


def _install() -> None:
    try:
        from dl2.record import install

        install()
    except Exception as err:  # never break the job
        _notice(f"recording not installed: {err!r}; the job continues")


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then installs dl2 when torch.distributed is usable."""

    def __init__(self, loader: Any, finder: _Finder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            # Put the real loader back: code that inspects a module's loader sees
            # torch's own, not this wrapper.
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
        # importlib marks the spec initializing until exec_module returns; the module
        # itself is complete here, so judge it done and its parents by their flags.
        if spec is not None:
            spec._initializing = False
        if not self._finder.done and _ready():
            self._finder.done = True
            _install()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """A post-import hook on torch and torch.distributed."""

    def __init__(self) -> None:
        self.done = False
        self._busy = False

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if self.done or self._busy or fullname not in _WATCHED:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname) if path is None else None
            if spec is None:
                spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        except Exception:
            spec = None
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader, self)
        return spec


def _chain_next_sitecustomize() -> None:
    """Run the ``sitecustomize`` that this module shadows, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    except Exception:
        spec = None
    if spec is None or spec.loader is None or spec.origin == __file__:
        return
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as err:
        _notice(f"the next sitecustomize ({spec.origin}) failed: {err!r}")


def _bootstrap() -> None:
    if os.environ.get("DL2_RUN_DIR") and os.environ.get("DL2_DISABLE", "") in ("", "0"):
        if _ready():
            _install()
        else:
            sys.meta_path.insert(0, _Finder())


_bootstrap()
_chain_next_sitecustomize()
