"""The recorder of one process: its trace writer, record ids and pending async works.

There is one :class:`Recorder` per process (``RECORDER``), created by
:func:`dl2.record.install`.  The trace file is opened when the default process group is
created, because only then is the global rank known.  Everything here is careful never
to raise into the job: recording errors cost the record, never the run.

Records are encoded and written by the stream's
:class:`~dl2.trace.schema.stream.StreamEncoder`, whose lines depend on the lines before
them (interned stacks, id and time deltas): each record is encoded and written under its
lock, so the file holds them in the order they were encoded, and a segment is rotated
between two records (:meth:`Recorder._roll` opens the next one).
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from dl2.notice import notice
from dl2.record.stack import STACKS
from dl2.record.stack import raised_at
from dl2.record.writer import TraceWriter
from dl2.trace.schema.stream import StreamEncoder

_now = time.monotonic_ns

# Pending works are polled (is_completed) and pruned when the dict grows past this.
PRUNE_AT = 64


def work_failed(work: Any) -> bool:
    """Whether a completed work ended with an error (gloo calls a work whose peer died
    completed): it must not be recorded ``done``.

    The work's future says so where it has one (a collective's): ``Work.exception()``
    prints torch's deprecation warning into the job's output, once per process, naming
    an API the user never called.  Only a work without a future (gloo's P2P works, which
    complete only inside the user's own wait) is asked directly.
    """
    try:
        future = work.get_future()
    except Exception:
        future = None
    if future is not None:
        try:
            if future.done():
                future.value()
                return False
        except Exception:
            return True
    try:
        return work.exception() is not None
    except Exception:
        return False


class Recorder:
    """Per-process recording state.

    Args:
        run_dir: the directory trace files are written to.

    Attributes:
        writer: the open trace writer, or None before the default group exists.
        enc: the stream encoder that writes the records (the recording group calls its
            :meth:`~dl2.trace.schema.stream.StreamEncoder.op`, the hot path, directly),
            or None while nothing is recorded.
        pending: op id -> (gloo's work, the group's global ranks for a wildcard recv or
            None) for async ops not yet waited on and not yet seen complete.
        blocking: thread id -> the blocking op that thread is waiting on.
        last_tid: the thread that issued the last op.
        ended: True once an ``end`` record with how="exit" was written.
        local: per-thread context (the caller's stack while a group is created).
    """

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.writer: TraceWriter | None = None
        self.enc: StreamEncoder | None = None
        self.fd = -1  # the writer's descriptor while it is enabled, else -1
        self.ids = itertools.count(1)
        self.pending: dict[int, tuple[Any, list[int] | None]] = {}
        self.blocking: dict[int, int] = {}  # thread id -> blocking op it is waiting on
        # thread id -> [batch id] while that thread is inside batch_isend_irecv (the id
        # of the batch's first op, 0 until it is issued).  Empty almost always.
        self.batches: dict[int, list[int]] = {}
        self.last_tid = 0  # the thread that issued the last op (the watchdog watches it)
        # Works the user polled with is_completed() and found incomplete since the
        # watchdog last looked: op id -> the user's stack at the first such poll.
        self.polled: dict[int, int] = {}
        self.ended = False
        self.local = threading.local()
        self.watchdog: Any = None
        # False once a device hold gave up (dl2.record.device.HOLD_LIMIT)
        self.device_holds = True
        # Emulated backend semantics (see dl2.record.emulate): the eager threshold in
        # bytes (-1: sends are gloo's rendezvous sends), the undelivered eager sends, and
        # the fused-batch gate (None: batches are issued op by op, as gloo does).
        self.eager_bytes = -1
        self.eager: Any = None
        self.gate: Any = None
        # threads of the user's code alive besides the main one (dl2.record.install)
        self.user_threads = 0
        self._threads_lock = threading.Lock()

    # -- the trace file ---------------------------------------------------------------

    def open(self, rank: int, world_size: int, torch_version: str, backend: str = "gloo") -> None:
        """Open (or keep) this process's trace file for global ``rank`` (``backend``: the
        default group's, for the header)."""
        writer = self.writer
        if writer is not None and writer.rank == rank and writer.pid == os.getpid():
            return
        if writer is not None:
            writer.close()
        self.writer = writer = TraceWriter(
            self.run_dir, rank, world_size, backend, torch_version, self.emulation()
        )
        self.fd = writer.fd
        self.enc = None
        if writer.enabled:
            self.enc = StreamEncoder(
                rank,
                writer.t0,
                STACKS,
                functools.partial(os.write, writer.fd),
                room=writer.room,
                roll=self._roll,
                on_error=self.fail,
                clock=_now,
            )
        self.ended = False
        if self.enc is not None and self.user_threads:
            self.enc.threads(_now(), self.user_threads)  # started before the trace
        if writer.enabled and self.watchdog is None:
            try:
                from dl2.record.watchdog import Watchdog

                self.watchdog = Watchdog(self)
                self.watchdog.start()
            except Exception as err:  # the watchdog is optional
                notice(f"watchdog not started: {err!r}")

    def _roll(self, segment: int, prologue: str) -> tuple[Any, int] | None:
        """Start the next segment (the encoder calls this under its lock)."""
        writer = self.writer
        if writer is None:
            return None
        writer.open_segment(segment, prologue)
        self.fd = writer.fd
        if not writer.enabled:
            return None
        return functools.partial(os.write, writer.fd), writer.room

    def emulation(self) -> tuple[int, bool] | None:
        """The header's ``emulate`` as ``(eager_bytes, fused_batches)``, or None when
        gloo runs as is."""
        if self.eager_bytes < 0 and self.gate is None:
            return None
        return max(self.eager_bytes, 0), self.gate is not None

    def drain_eager(self, timeout: float) -> None:
        """Wait (bounded) for the eager sends gloo has not delivered yet."""
        eager = self.eager
        if eager is None or not len(eager):
            return
        left = eager.drain(timeout)
        if left:
            notice(
                f"{left} eager send(s) not received after {timeout:g} s; "
                "exiting without delivering them"
            )

    @property
    def active(self) -> bool:
        """True while records can be written."""
        return self.fd >= 0

    @property
    def tail(self) -> Any:
        """The records held back to share the next write."""
        return self.enc.tail if self.enc is not None else ()

    # -- records (see dl2.trace.schema.stream for each) ----------------------------------

    def op(self, *args: Any, **kwargs: Any) -> None:
        """An op entered (the recording group calls ``enc.op`` itself on its hot path)."""
        enc = self.enc
        if enc is not None and self.fd >= 0:
            enc.op(*args, **kwargs)

    def thread_started(self) -> None:
        """A thread of the user's code started (called from it): the ``threads`` record."""
        self._threads_changed(1)

    def thread_ended(self) -> None:
        """A thread of the user's code ended (called from it, last)."""
        self._threads_changed(-1)

    def _threads_changed(self, delta: int) -> None:
        """Count and record (never raises: it runs at the start and end of user threads)."""
        try:
            with self._threads_lock:
                self.user_threads = live = max(self.user_threads + delta, 0)
                enc = self.enc
                if enc is not None and self.fd >= 0:
                    enc.threads(_now(), live)
        except Exception:
            pass

    def issued_wait(
        self, oid: int, wid: int, t: int, tid: int, sid: int, returned: bool = False
    ) -> None:
        """Blocking op ``oid`` was issued and its thread waits on it (wait ``wid``);
        ``returned``: the wait returned at once.

        Held back like the wait's ``ret`` (:meth:`ret_later`): when the wait returns
        quickly, both share the next record's write (a blocking op costs one write);
        when it blocks, the watchdog writes it within one period.
        """
        enc = self.enc
        if enc is not None and self.fd >= 0:
            enc.hold_issued_wait(oid, wid, t, tid, sid)
            if returned:
                enc.hold_ret(wid, t)

    def ret_later(self, oid: int, src: int | None) -> None:
        """A ``ret`` that may wait for the next write (at most one watchdog period).

        The ``ret`` of a completed wait is the one record after which nothing is
        issued, so it can share the next record's write instead of costing a syscall of
        its own; the watchdog and the exit hook flush it when no record follows.
        """
        enc = self.enc
        if enc is not None:
            enc.hold_ret(oid, _now(), src)

    def wait(self, wid: int, t: int, tid: int, work: int, sid: int, returned: bool = False) -> None:
        """Thread ``tid`` waits on op ``work`` (``returned``: the wait returned at once)."""
        enc = self.enc
        if enc is not None and self.fd >= 0:
            enc.wait(wid, t, tid, work, sid, t if returned else 0)

    def ret(self, oid: int, err: BaseException | None = None, src: int | None = None) -> None:
        """The ``ret`` record of op or wait ``oid``."""
        enc = self.enc
        if enc is not None and self.fd >= 0:
            enc.ret(oid, _now(), _describe(err) if err is not None else None, src)

    def done(self, oid: int, src: int | None = None) -> None:
        """The ``done`` record of async op ``oid`` seen complete."""
        enc = self.enc
        if enc is not None and self.fd >= 0:
            enc.done(oid, _now(), src)

    def newgroup(
        self, nid: int, t: int, ranks: Sequence[int] | None, gid: str | None, sid: int
    ) -> None:
        enc = self.enc
        if enc is not None and self.fd >= 0:
            enc.newgroup(nid, t, ranks, gid, sid)

    def nonmember(self, t: int, api: str, sid: int) -> None:
        enc = self.enc
        if enc is not None and self.fd >= 0:
            enc.nonmember(t, api, sid)

    def store(
        self,
        cid: int,
        t: int,
        tid: int,
        op: str,
        store: str | None,
        prefix: str,
        keys: Sequence[str],
        block: bool,
        sid: int,
        timeout: float | None = None,
    ) -> None:
        """A c10d Store call (see :meth:`~dl2.trace.schema.stream.StreamEncoder.store`)."""
        enc = self.enc
        if enc is not None and self.fd >= 0:
            enc.store(cid, t, tid, op, store, prefix, keys, block, sid, timeout)

    def state(self, t: int, pending: Sequence[int], where: str, sid: int) -> None:
        """The watchdog's ``state`` record."""
        enc = self.enc
        if enc is not None and self.fd >= 0:
            enc.state_record(t, pending, where, sid)

    def device_wait(self, wid: int, work: Any) -> None:
        """Wait ``wid`` returned with ``work`` incomplete (a device wait, see
        :mod:`dl2.record.device`): its ``ret`` is written when the work completes, and the
        rank's records are held back until then."""
        enc = self.enc
        if enc is None or self.fd < 0:
            return
        from dl2.record.device import DeviceHold

        if not self.device_holds:
            enc.hold_ret(wid, _now(), None)  # holding gave up: as a wait that returned
            return

        if isinstance(enc, DeviceHold):
            enc.device_wait(wid, work)
            return
        enc.flush()  # the op and its wait go out now: the rank is seen in the wait
        self.enc = DeviceHold(self, enc, wid, work)  # type: ignore[assignment]

    @property
    def holding(self) -> bool:
        """True while a device wait holds the rank's records back."""
        enc = self.enc
        return enc is not None and type(enc).__name__ == "DeviceHold"

    def release(self, force: bool = False) -> None:
        """Write what a device hold kept back once its wait completed (all of it with
        ``force``: the rank ends)."""
        enc: Any = self.enc
        if enc is not None and type(enc).__name__ == "DeviceHold":
            enc.release(force)

    def thread_error(self, name: str, exc: BaseException) -> None:
        """The ``thread_error`` record of the calling thread, which ``exc`` ends."""
        enc = self.enc
        if enc is None or self.fd < 0:
            return
        enc.thread_error(_now(), threading.get_ident(), name, _describe(exc), raised_at(exc))

    def end(self, how: str, exc: BaseException | None = None) -> None:
        """The ``end`` record: the rank shuts down cleanly ("exit" or "destroy");
        ``exc``: the uncaught exception that ended the program, if one did."""
        self.release(force=True)
        enc = self.enc
        if not self.active or enc is None:
            return
        if how == "exit":
            if self.ended:
                return
            self.ended = True
        # Works seen complete by now are recorded before the end; the rest end with
        # their groups (nothing is written of them after it).
        self.poll_pending()
        self.pending = {}
        err, sid = None, 0
        if exc is not None:
            try:
                err, sid = _describe(exc), raised_at(exc)
            except Exception:
                err, sid = None, 0
        enc.end(_now(), how, err, sid)

    def flush(self) -> None:
        """Write the held-back records now."""
        enc = self.enc
        if enc is not None and self.fd >= 0:
            enc.flush()

    def fail(self, err: OSError) -> None:
        """A write failed: stop recording (the writer prints the one-line notice)."""
        self.fd = -1
        if self.writer is not None:
            self.writer.fail(err)

    def close(self) -> None:
        """Stop recording and close the file (held-back records are written first)."""
        self.release(force=True)
        self.flush()
        self.fd = -1
        if self.writer is not None:
            self.writer.close()

    # -- pending async works ----------------------------------------------------------

    def add_pending(self, oid: int, work: Any, anysource_ranks: list[int] | None) -> None:
        pending = self.pending
        pending[oid] = (work, anysource_ranks)
        if len(pending) >= PRUNE_AT:
            self.poll_pending()

    def poll_pending(self) -> list[int]:
        """Drop completed works (writing their ``done``); return the ids still pending.

        The ``done`` records of one poll go out in one write (held back, then flushed):
        the watchdog finds a DDP job's buckets complete a dozen at a time.
        """
        still: list[int] = []
        held = False
        for oid, (work, anyranks) in list(self.pending.items()):
            try:
                completed = work.is_completed()
            except Exception:
                completed = True
            if not completed:
                still.append(oid)
                continue
            if self.pending.pop(oid, None) is None:
                continue  # waited on meanwhile: its wait/ret records say it all
            if work_failed(work):
                continue  # not done: it stays unfinished in the trace (a wait would raise)
            src = source_of(work, anyranks)
            enc = self.enc
            if enc is not None and self.fd >= 0:
                enc.hold_done(oid, _now(), src)
                held = True
        if held:
            self.flush()
        return still

    def reset_after_fork(self) -> None:
        """In a forked child: forget the parent's file, works and watchdog (the parent's
        held-back lines are the parent's to write; the child closes only its copy of the
        descriptor)."""
        self.enc = None  # its lock may have been held by another thread at the fork
        self.fd = -1
        self.user_threads = 0  # only the forking thread lives on in the child
        self._threads_lock = threading.Lock()
        if self.writer is not None:
            self.writer.close()
        self.writer = None
        self.pending = {}
        self.blocking = {}
        self.batches = {}
        self.last_tid = 0
        self.polled = {}
        self.watchdog = None
        self.ended = False
        if self.eager is not None:
            self.eager.reset_after_fork()
        if self.gate is not None:
            self.gate.reset_after_fork()


def source_of(work: Any, anysource_ranks: list[int] | None) -> int | None:
    """The global rank a completed wildcard recv matched, or None."""
    if anysource_ranks is None:
        return None
    try:
        group_rank = int(work._source_rank())
        return anysource_ranks[group_rank]
    except Exception:
        return None


def _describe(err: BaseException) -> str:
    """``Type: message``, at most 500 characters: a longer message keeps its start and
    its end (an exception that wraps another's traceback says what failed last)."""
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= 500 else text[:247] + " ... " + text[-248:]


RECORDER: Recorder | None = None
