"""A custom c10d backend named "fakenccl": gloo underneath, NCCL's completion semantics.

Registered through ``torch.distributed.Backend.register_backend``, so dl2 sees a group
whose backend is not gloo (the path an NCCL job takes) on a CPU-only machine.  Like
NCCL, every op of a process runs in issue order on one "stream" (a worker thread that
runs the gloo op to completion), and ``wait()`` returns at once, the op still running
(NCCL's wait only makes the current CUDA stream wait); :func:`synchronize` blocks until
the stream is idle, as ``torch.cuda.synchronize()`` does.  With ``FAKENCCL_BLOCKING=1``
``wait()`` blocks until the op is done, as NCCL's does with ``TORCH_NCCL_BLOCKING_WAIT=1``.

Import it in a job and call :func:`register` before creating groups.

:func:`register` also registers "cxxgloo", a custom backend whose creator returns
torch's own ``ProcessGroupGloo``: torch then builds a C++ ``ProcessGroup`` holding it as
a CUSTOM backend, which is the shape of an NCCL or mixed group (a C++ group with its
backends registered per device), with waits that block.
"""

from __future__ import annotations

import os
import queue
import threading
from datetime import timedelta
from typing import Any

import torch.distributed as dist

NAME = "fakenccl"


class _Stream:
    """One in-order queue per process, run by a daemon thread."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[tuple[Any, threading.Event]] = queue.Queue()
        self.idle = threading.Condition()
        self.queued = 0
        threading.Thread(target=self._run, name="fakenccl-stream", daemon=True).start()

    def launch(self, fn: Any) -> threading.Event:
        done = threading.Event()
        with self.idle:
            self.queued += 1
        self.jobs.put((fn, done))
        return done

    def _run(self) -> None:
        while True:
            fn, done = self.jobs.get()
            try:
                fn()
            except Exception:
                pass
            done.set()
            with self.idle:
                self.queued -= 1
                self.idle.notify_all()

    def synchronize(self) -> None:
        with self.idle:
            while self.queued:
                self.idle.wait()


_STREAM: _Stream | None = None


def _stream() -> _Stream:
    global _STREAM
    if _STREAM is None:
        _STREAM = _Stream()
    return _STREAM


def synchronize() -> None:
    """Block until every op issued so far has run (``torch.cuda.synchronize()``)."""
    _stream().synchronize()


class FakeWork(dist.Work):  # type: ignore[misc]
    def __init__(self, done: threading.Event) -> None:
        super().__init__()
        self._done = done

    def wait(self, timeout: timedelta | None = None) -> bool:
        if os.environ.get("FAKENCCL_BLOCKING", "") == "1":
            self._done.wait()
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set()


class FakeNcclGroup(dist.ProcessGroup):  # type: ignore[misc]
    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout=timeout)

    def getBackendName(self) -> str:
        return NAME

    def _launch(self, call: Any) -> FakeWork:
        return FakeWork(_stream().launch(lambda: call().wait()))

    def allreduce(self, tensors: Any, opts: Any = None) -> FakeWork:
        opts = opts if opts is not None else dist.AllreduceOptions()
        return self._launch(lambda: self._gloo.allreduce(tensors, opts))

    def broadcast(self, tensors: Any, opts: Any = None) -> FakeWork:
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._launch(lambda: self._gloo.broadcast(tensors, opts))

    def barrier(self, opts: Any = None) -> FakeWork:
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._launch(lambda: self._gloo.barrier(opts))

    def send(self, tensors: Any, dst: int, tag: int = 0) -> FakeWork:
        return self._launch(lambda: self._gloo.send(tensors, dst, tag))

    def recv(self, tensors: Any, src: int, tag: int = 0) -> FakeWork:
        return self._launch(lambda: self._gloo.recv(tensors, src, tag))


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> FakeNcclGroup:
    return FakeNcclGroup(store, rank, size, timeout)


def _create_cxx(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    return dist.ProcessGroupGloo(store, rank, size, timeout=timeout)


def register() -> None:
    """Register the "fakenccl" and "cxxgloo" backends (once per process)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=["cpu"])
    if "CXXGLOO" not in dist.Backend._plugins:
        dist.Backend.register_backend("cxxgloo", _create_cxx, devices=["cpu"])
