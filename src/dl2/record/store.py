"""Recording of c10d Store calls: a rank blocked in ``store.get`` waits on whoever sets
the key.

The Store classes are pybind11 types (``torch._C._distributed_c10d``): every method is
defined once, on the base class ``Store``, and TCPStore, FileStore, HashStore and
PrefixStore inherit it.  :func:`patch_stores` replaces those methods on ``Store`` (the
class accepts new attributes) with wrappers that write a ``store`` record before the
call and, for a call that waits for its keys (get, wait, multi_get), a ``ret`` when it
returns.  C++ callers (gloo's rendezvous, TCPStore's own barrier, ProcessGroup
constructors) reach the C++ methods directly and are never seen.

Only calls made by user code or by a library are recorded.  A call made from dl2, or
from torch.distributed inside one of its API functions (``init_process_group``,
``new_group``, ``_store_based_barrier``, the rendezvous handlers), is torch's own
bookkeeping and is left out, so that every job's trace is free of that noise; so is a
call from torch code with no user frame on the stack (a torch thread).

The store's identity, which names a key across ranks, is read from the object: the
port of a TCPStore, the path of a FileStore, and the prefixes of the PrefixStores in
front of it.  A PrefixStore does not expose its prefix, so ``PrefixStore.__init__`` is
wrapped to work out the new store's identity (in a weak dictionary) when one is
created, while the store it wraps is at hand.

Every failure inside dl2 is swallowed: the call then runs unrecorded.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from dl2.record.recorder import Recorder
from dl2.record.stack import _DL2_DIRS
from dl2.record.stack import _TORCH_DIRS
from dl2.record.stack import caller_frame
from dl2.record.stack import capture
from dl2.trace.schema import STORE_SETS
from dl2.trace.schema import STORE_WAITS

_now = time.monotonic_ns
_tid = threading.get_ident

#: the Store methods recorded: name -> (index of the keys argument, its name, the keys
#: are a list).  Methods this torch lacks are skipped.
STORE_METHODS: dict[str, tuple[int, str, bool]] = {
    "get": (0, "key", False),
    "wait": (0, "keys", True),
    "multi_get": (0, "keys", True),
    "set": (0, "key", False),
    "add": (0, "key", False),
    "compare_set": (0, "key", False),
    "multi_set": (0, "keys", True),
    "append": (0, "key", False),
    "delete_key": (0, "key", False),
    "check": (0, "keys", True),
}
assert STORE_METHODS.keys() >= STORE_WAITS | STORE_SETS

#: PrefixStore -> its identity (see :func:`identity`), worked out when it is created
_IDENTITIES: weakref.WeakKeyDictionary[Any, tuple[str | None, str]] = weakref.WeakKeyDictionary()


def patch_stores(patch: Callable[[Any, str, Any], Any], rec: Recorder) -> None:
    """Wrap the Store methods and ``PrefixStore.__init__``.

    Args:
        patch: ``patch(obj, name, new)`` sets an attribute and remembers the original
            (:meth:`dl2.record.install._Installed.patch`, so uninstall undoes it).
        rec: the process's recorder.
    """
    import torch.distributed as dist

    store_cls = dist.Store
    prefix_cls = dist.PrefixStore
    original_init = prefix_cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        try:
            prefix = args[0] if args else kwargs.get("prefix")
            inner = args[1] if len(args) > 1 else kwargs.get("store")
            if isinstance(prefix, str):
                base, in_front = identity(inner)
                # The inner store puts its own prefix in front of this one's.
                _IDENTITIES[self] = (base, f"{in_front}{prefix}/")
        except Exception:
            pass

    patch(prefix_cls, "__init__", __init__)
    for name in STORE_METHODS:
        original = getattr(store_cls, name, None)
        if original is not None:
            patch(store_cls, name, _wrap(name, original, rec))


def identity(store: Any) -> tuple[str | None, str]:
    """The store's identity and the prefix its PrefixStores put in front of a key.

    The identity is "tcp:<port>" for a TCPStore, "file:<path>" for a FileStore, None
    when it cannot be told: a HashStore (local to its process), a store written in
    Python, a PrefixStore created before recording began or by C++ (whose prefix dl2
    never saw; the Python object ``underlying_store`` returns for an inner PrefixStore
    is such a one once the object it was created as is gone).  The prefix of
    ``PrefixStore("b", PrefixStore("a", tcp))`` is "a/b/".
    """
    import torch.distributed as dist

    if isinstance(store, dist.PrefixStore):
        try:
            return _IDENTITIES.get(store) or (None, "")
        except TypeError:
            return None, ""
    if isinstance(store, dist.TCPStore):
        return f"tcp:{store.port}", ""
    if isinstance(store, dist.FileStore):
        return f"file:{os.path.realpath(store.path)}", ""
    return None, ""


def _keys(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    index, keyword, many = STORE_METHODS[name]
    value = args[index] if len(args) > index else kwargs.get(keyword)
    if value is None:
        return []
    if many:
        return [str(k) for k in value]
    return [str(value)]


def _timeout(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float | None:
    """wait(keys, timeout)'s own timeout in seconds, if given."""
    if name != "wait":
        return None
    value = args[1] if len(args) > 1 else kwargs.get("timeout")
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return None


def _record(
    rec: Recorder,
    name: str,
    store: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    frame: Any,
) -> int:
    """Write the ``store`` record of a call; its id, or 0 when it is not recorded."""
    caller = frame.f_code.co_filename if frame is not None else ""
    if caller.startswith(_DL2_DIRS):
        return 0  # dl2's own use of the store (fused-batch emulation)
    api, stack = capture(frame)
    if api is not None:
        return 0  # inside a torch.distributed API function: its own bookkeeping
    if stack == 0 and caller.startswith(_TORCH_DIRS):  # sid 0: the empty stack
        return 0  # torch code with no user frame above it (a torch thread)
    keys = _keys(name, args, kwargs)
    base, prefix = identity(store)
    block = name in STORE_WAITS
    sid = next(rec.ids)
    # rec.last_tid is left alone: the watchdog keeps watching the thread that issues the
    # rank's ops, which tells a rank blocked in a store wait ("comm") from one whose
    # other thread waits there while it computes ("python")
    tid = _tid()
    timeout = _timeout(name, args, kwargs)
    rec.store(sid, _now(), tid, name, base, prefix, keys, block, stack, timeout)
    return sid


def _wrap(name: str, original: Any, rec: Recorder) -> Callable[..., Any]:
    block = name in STORE_WAITS

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if rec.fd < 0:
            return original(self, *args, **kwargs)
        try:
            sid = _record(rec, name, self, args, kwargs, caller_frame())
        except Exception:
            sid = 0
        if not sid or not block:
            return original(self, *args, **kwargs)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as err:
            try:
                rec.ret(sid, err)
            except Exception:
                pass
            raise
        try:
            rec.ret(sid)
        except Exception:
            pass
        return result

    method.__name__ = name
    method.__qualname__ = f"Store.{name}"
    method.__doc__ = getattr(original, "__doc__", None)
    return method
