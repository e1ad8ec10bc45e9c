"""The works a recording group hands back: recorded waits, eager sends, deferred ops.

:class:`RecordedWork` wraps gloo's work of a recorded async op (its ``wait()`` writes
``wait`` and ``ret`` records, polls of ``is_completed()`` are noted for the watchdog),
:class:`EagerWork` is the already-complete work of an emulated eager send, and
:class:`DeferredWork` the placeholder of a fused-batch op until its batch launches.
The first and last forward everything else to the real work (:class:`ForwardingWork`).
"""

from __future__ import annotations

import functools
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dl2.record.recorder import Recorder
from dl2.record.recorder import source_of
from dl2.record.recorder import work_failed
from dl2.record.source import SourceRank
from dl2.record.stack import LIB
from dl2.record.stack import caller_frame
from dl2.record.stack import file_kind
from dl2.record.stack import user_stack_id

_now = time.monotonic_ns
_tid = threading.get_ident
_work_init = dist.Work.__init__


class ForwardingWork(dist.Work):  # type: ignore[misc]
    """A work that forwards every method to ``_dl2_work`` (set by the subclass).

    The methods ``dist.Work`` defines are forwarded one by one (``__getattr__`` is only
    reached for names it does not define).
    """

    # Slots, not an instance dict: a work is made per async op (per DDP bucket), and
    # slots make it about twice as fast to build.  Like gloo's own works, a work takes
    # no new attributes.
    __slots__ = ("_dl2_work",)

    _dl2_work: Any

    def wait(self, timeout: timedelta | None = None) -> bool:
        work = self._dl2_work
        return bool(work.wait() if timeout is None else work.wait(timeout))

    def is_completed(self) -> bool:
        return bool(self._dl2_work.is_completed())

    def is_success(self) -> bool:
        return bool(self._dl2_work.is_success())

    def exception(self) -> Any:
        return self._dl2_work.exception()

    def result(self) -> Any:
        return self._dl2_work.result()

    def synchronize(self) -> Any:
        return self._dl2_work.synchronize()

    def get_future(self) -> Any:
        return self._dl2_work.get_future()

    def source_rank(self) -> int:
        return int(self._dl2_work.source_rank())

    def _source_rank(self) -> int:
        rank = self._dl2_work._source_rank()
        return rank if isinstance(rank, int) else int(rank)  # a SourceRank stays one

    def get_future_result(self) -> Any:
        return self._dl2_work.get_future_result()

    def block_current_stream(self) -> Any:
        return self._dl2_work.block_current_stream()

    def _get_op_type(self) -> Any:
        return self._dl2_work._get_op_type()

    def _get_duration(self) -> Any:
        return self._dl2_work._get_duration()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_dl2_"):
            raise AttributeError(name)
        return getattr(self._dl2_work, name)


class DeferredWork(ForwardingWork):
    """The work of a fused-batch op, bound to the real work when its batch launches
    (before ``batch_isend_irecv`` returns); every method forwards to it."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__()
        self._dl2_work = None

    def _dl2_bind(self, work: Any) -> None:
        self._dl2_work = work


class RecordedWork(ForwardingWork):
    """The work of a recorded async op: ``wait()`` is recorded, the rest is forwarded.

    Args:
        inner: gloo's work.
        oid: the op record's id.
        recorder: the process's recorder.
        anyranks: for a wildcard recv, the group's global ranks (to name the sender).
        waited: for a blocking P2P op already waited on (and recorded) by the group,
            the result its wait() returns again without waiting.
        p2p: a send or receive: dropped by its owner before it completed, it is let go
            (see :meth:`__del__`).
        device: the work of a group whose ``wait()`` may return before the op completes
            (:mod:`dl2.record.device`): such a wait's ``ret`` waits for completion.
    """

    __slots__ = (
        "_dl2_anyranks",
        "_dl2_device",
        "_dl2_oid",
        "_dl2_p2p",
        "_dl2_poll_stack",
        "_dl2_rec",
        "_dl2_waited",
    )

    def __init__(
        self,
        inner: Any,
        oid: int,
        recorder: Recorder,
        anyranks: list[int] | None,
        waited: bool | None = None,
        p2p: bool = False,
        device: bool = False,
    ) -> None:
        _work_init(self)
        self._dl2_device = device
        self._dl2_work = inner
        self._dl2_oid = oid
        self._dl2_rec = recorder
        self._dl2_anyranks = anyranks
        self._dl2_waited = waited
        self._dl2_p2p = p2p
        self._dl2_poll_stack: int | None = None

    def __del__(self) -> None:
        """The owner dropped a send or receive it never waited on.

        gloo moves a P2P message only while both sides' works live: a dropped one never
        transfers.  The recorder's pending table would keep it alive (and the job would
        complete under dl2 only), so the work is let go here, with a ``drop`` record
        (held back to the next write: no syscall in a finaliser); one that completed
        meanwhile gets its ``done`` instead.
        """
        if not self._dl2_p2p:
            return
        try:
            rec = self._dl2_rec
            oid = self._dl2_oid
            enc = rec.enc
            if rec.pending.pop(oid, None) is None or rec.fd < 0 or enc is None:
                return  # waited on, seen complete, or not recording
            inner = self._dl2_work
            if inner.is_completed():
                if not work_failed(inner):
                    enc.hold_done(oid, _now(), source_of(inner, self._dl2_anyranks))
            else:
                enc.hold_drop(oid, _now())
        except Exception:
            pass

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Wait for the op, between a ``wait`` and a ``ret`` record; returns gloo's bool."""
        if self._dl2_waited is not None:
            return self._dl2_waited
        inner = self._dl2_work
        rec = self._dl2_rec
        if rec.fd < 0:  # not recording
            return bool(inner.wait() if timeout is None else inner.wait(timeout))
        try:
            wid = next(rec.ids)
            rec.wait(wid, _now(), _tid(), self._dl2_oid, user_stack_id(caller_frame()))
        except Exception:
            return bool(inner.wait() if timeout is None else inner.wait(timeout))
        try:
            ok = inner.wait() if timeout is None else inner.wait(timeout)
        except BaseException as err:
            # its failure is told by this ret: no ``done`` later (gloo calls a work that
            # failed completed)
            rec.pending.pop(self._dl2_oid, None)
            rec.ret(wid, err)
            raise
        rec.pending.pop(self._dl2_oid, None)
        anyranks = self._dl2_anyranks
        if self._dl2_device and not work_completed(inner):
            rec.device_wait(wid, inner)  # the device waits; the ret when it is done
            return bool(ok)
        rec.ret_later(wid, source_of(inner, anyranks) if anyranks is not None else None)
        return bool(ok)

    def _source_rank(self) -> int:
        """The sender's group rank, as a :class:`~dl2.record.source.SourceRank` for a
        wildcard receive (what ``dist.recv(src=None)`` returns on the world group)."""
        rank = int(self._dl2_work._source_rank())
        if self._dl2_anyranks is None:
            return rank
        try:
            return SourceRank(rank, self._dl2_oid)
        except Exception:
            return rank

    source_rank = _source_rank

    def get_future(self) -> Any:
        """gloo's future; asked for by the user's own code while the op is pending, a
        future completed with it whose callbacks count as a thread of the user's until
        they ran (see :func:`watched_future`)."""
        future = self._dl2_work.get_future()
        if self._dl2_device or not _cpu_only():
            return future  # a future of CUDA tensors needs its devices: left as it is
        try:
            caller = caller_frame()  # None: from a thread C++ started
            if caller is None or file_kind(caller.f_code.co_filename) == LIB:
                return future  # torch's own (DDP's reducer, from C++)
            if self._dl2_work.is_completed():
                return future  # done already
            return watched_future(future, self._dl2_rec, self._dl2_oid)
        except Exception:
            return future

    def is_completed(self) -> bool:
        completed = bool(self._dl2_work.is_completed())
        if self._dl2_waited is not None:
            return completed
        try:
            rec = self._dl2_rec
            if completed:  # seen complete by its owner: record it now, not at the next poll
                if rec.pending.pop(self._dl2_oid, None) is not None and not work_failed(
                    self._dl2_work
                ):
                    rec.done(self._dl2_oid, source_of(self._dl2_work, self._dl2_anyranks))
            elif self._dl2_oid not in rec.polled:
                # The user polls it: the watchdog tells a rank spinning on polls apart
                # from one computing (see Watchdog.tick).
                stack = self._dl2_poll_stack
                if stack is None:
                    stack = self._dl2_poll_stack = user_stack_id(caller_frame())
                rec.polled[self._dl2_oid] = stack
        except Exception:
            pass
        return completed


@functools.cache
def _cpu_only() -> bool:
    """Whether no CUDA device is usable here (asked once): a future made by dl2 has no
    devices, and one whose value holds CUDA tensors would refuse it."""
    try:
        return not torch.cuda.is_available()
    except Exception:
        return False


def watched_future(future: Any, recorder: Recorder, oid: int = 0) -> Any:
    """A future completed with ``future`` (its value or its error), whose ``then`` and
    ``add_done_callback`` count as a thread of the user's code from the first callback
    given until the callbacks ran: a callback runs when the op completes, in a thread
    of gloo's, and may itself communicate (``work.get_future().then(send_reply)``), so
    a rank waiting elsewhere meanwhile is not stuck.  Waiting on it is what waiting on
    ``future`` is (``torch.futures.wait_all`` included), and its ``done()`` asked while
    op ``oid`` is pending is a poll of it, as ``work.is_completed()`` is (a loop
    spinning on it is told from a rank that computes: see Watchdog.tick)."""
    chained: Any = torch.futures.Future()
    chained._dl2_work = True  # a wait on it waits on the op (see stack.where)
    chained._dl2_source = future  # what C++ gets back instead (see source_future)
    lock = threading.Lock()
    asked = chained.done

    def done() -> bool:
        finished = bool(asked())
        if not finished and oid:
            try:
                if oid in recorder.pending and oid not in recorder.polled:
                    recorder.polled[oid] = user_stack_id(caller_frame())
            except Exception:
                pass
        return finished

    state = {"counted": False, "done": False}

    def counting(method: Any) -> Any:
        def attach(callback: Any) -> Any:
            with lock:
                if not state["done"] and not state["counted"]:
                    state["counted"] = True
                    recorder.thread_started()
            return method(callback)

        return attach

    def transfer(done: Any) -> None:
        try:
            _complete_with(chained, done)
        finally:  # the callbacks ran inside set_result / set_exception
            with lock:
                state["done"] = True
                if state["counted"]:
                    recorder.thread_ended()

    then = chained.then
    chained.then = counting(lambda callback: marked_future(then(callback)))
    chained.add_done_callback = counting(chained.add_done_callback)
    chained.done = done
    future.add_done_callback(transfer)
    return chained


def marked_future(future: Any) -> Any:
    """A Python future completed with ``future`` (a C++ one torch made: a ``then`` on a
    work's future, a ``collect_all`` of some), marked as waiting on an op: a wait on
    the C++ one runs under the user's own line, where the watchdog cannot tell it from
    computing; a wait on this one runs in torch.futures, where it can (see
    :func:`dl2.record.stack.where`)."""
    out: Any = torch.futures.Future()
    out._dl2_work = True
    out._dl2_source = future
    future.add_done_callback(lambda done: _complete_with(out, done))
    return out


def source_future(future: Any) -> Any:
    """The future torch made that a future of dl2's is completed from (else ``future``
    itself): what goes back to torch's C++ code (a DDP comm hook's result).  A Python
    future holds an error as a value that only Python raises: read in C++, it is a
    value that cannot be cast ("Unable to cast ... to Tensor"), where torch's own
    future fails with the op's error."""
    return getattr(future, "_dl2_source", future)


def _complete_with(future: Any, done: Any) -> None:
    """Complete ``future`` with what the completed ``done`` holds: its value or error."""
    try:
        value = done.value()
    except Exception as err:
        future.set_exception(err)
    else:
        future.set_result(value)


def work_completed(work: Any) -> bool:
    """Whether ``work`` says it completed; a work that cannot say counts as completed
    (it holds nothing back: see :mod:`dl2.record.device`)."""
    try:
        return bool(work.is_completed())
    except Exception:
        return True


class EagerWork(dist.Work):  # type: ignore[misc]
    """The work of an eager send: complete for the caller from the start.

    ``wait()`` returns True at once; for an async send, each wait is still recorded
    (a ``wait`` and its ``ret``), as for any other work.

    Args:
        oid: the op record's id.
        recorder: the process's recorder.
        buffer: the copy gloo sends (also what ``result()`` returns).
        waited: True for a blocking send, whose wait the group recorded already.
    """

    __slots__ = ("_dl2_buffer", "_dl2_oid", "_dl2_rec", "_dl2_waited")

    def __init__(self, oid: int, recorder: Recorder, buffer: list[Any], waited: bool) -> None:
        super().__init__()
        self._dl2_oid = oid
        self._dl2_rec = recorder
        self._dl2_buffer = buffer
        self._dl2_waited = waited

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self._dl2_waited:
            return True
        rec = self._dl2_rec
        try:
            if rec.active:
                wid = next(rec.ids)
                stack = user_stack_id(caller_frame())
                rec.wait(wid, _now(), _tid(), self._dl2_oid, stack, returned=True)
        except Exception:
            pass
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def result(self) -> Any:
        return list(self._dl2_buffer)

    def synchronize(self) -> None:
        return None

    def get_future(self) -> Any:
        future: Any = torch.futures.Future()
        future.set_result(list(self._dl2_buffer))
        return future

    def block_current_stream(self) -> None:
        return None
