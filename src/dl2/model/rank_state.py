"""One rank's state, updated record by record: its ops, their fates, its open calls.

A :class:`RankModel` is fed the typed records of one rank's trace in file order, any
number at a time; each record costs a few dictionary operations.  Each op is an
:class:`OpState` (the record and what later records say of it: issued, completed,
failed, the sender a wildcard receive matched, where the rank first waited on it); the
model hands every new op and every change that matters for matching to a
:class:`Sink` (the cross-rank :class:`dl2.model.matcher.Matcher`), which may fold
finished ops away.  :meth:`RankModel.blocked` and :meth:`RankModel.timeline` read the
rank's state on demand.

A rank may start at a checkpoint (:mod:`dl2.model.checkpoint`): the first record of a
rotated segment, which stands for the history before it.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING
from typing import Protocol

import msgspec

from dl2.model.checkpoint import CheckpointRecord
from dl2.model.checkpoint import ModelRecord
from dl2.model.ops import P2P_OPS
from dl2.model.ops import Blocked
from dl2.model.ops import Op
from dl2.model.ops import Timeline
from dl2.model.ops import store_key
from dl2.model.ops import store_op
from dl2.model.stuck import stall_kind
from dl2.trace.schema import STORE_SETS
from dl2.trace.schema.decode import DoneRecord
from dl2.trace.schema.decode import DropRecord
from dl2.trace.schema.decode import EndRecord
from dl2.trace.schema.decode import Frame
from dl2.trace.schema.decode import NewGroupRecord
from dl2.trace.schema.decode import NonMemberRecord
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import StateRecord
from dl2.trace.schema.decode import StoreRecord
from dl2.trace.schema.decode import ThreadErrorRecord
from dl2.trace.schema.decode import ThreadsRecord
from dl2.trace.schema.decode import WaitRecord

#: blocking ops that complete when their call returns (no work to wait on)
_COMPLETE_ON_RETURN = frozenset({"create_group", "monitored_barrier"})


class OpState(msgspec.Struct, gc=False):
    """One op of a rank: its record and what the records after it say of it.

    ``issued`` means the call returned; ``completed`` that a wait on it returned or the
    watchdog saw it done; ``pos`` is a collective's position on its group (set by the
    matcher).  :meth:`op` is the immutable :class:`~dl2.model.ops.Op` of the moment.

    A struct the garbage collector does not track (``gc=False``; it takes part in no
    reference cycle): the model keeps up to its window of them, and tracking them made
    each collection scan them all.  Compared by identity, never by value.
    """

    rec: OpRecord
    rank: int
    index: int
    pos: int = -1
    issued: bool = False
    completed: bool = False
    error: str | None = None
    src: int | None = None
    waited_at: int | None = None
    dropped: bool = False
    cached: Op | None = None
    #: where it was first waited on, if not where it was issued
    wait_stack: tuple[Frame, ...] = ()

    @property
    def done(self) -> bool:
        """Issued and completed without error: nothing can happen to it any more."""
        return self.issued and self.completed and self.error is None

    @property
    def pending_wildcard(self) -> bool:
        """A receive from any sender whose sender is not known (yet)."""
        return self.src is None and self.rec.peer is None and self.rec.op == "recv"

    def op(self) -> Op:
        """The :class:`Op` of the moment (built once per change).

        Built without ``Op.__init__``, whose frozen checks cost 8 times the rest: every
        field is set here (``tests/unit/test_incremental.py`` checks that none is
        forgotten), and an ``Op`` stays immutable once built.
        """
        op = self.cached
        if op is None:
            rec = self.rec
            op = self.cached = _new(Op)
            op.__dict__.update(
                rank=self.rank,
                id=rec.id,
                op=rec.op,
                gid=rec.gid,
                index=self.index,
                seq=rec.seq,
                api=rec.api,
                peer=rec.peer,
                root=rec.root,
                tag=rec.tag,
                redop=rec.redop,
                dtype=rec.dtype,
                count=rec.count,
                splits=rec.splits,
                ranks=rec.ranks,
                timeout=rec.timeout,
                is_async=rec.is_async,
                batch=rec.batch,
                stack=rec.stack,
                issued=self.issued,
                completed=self.completed,
                error=self.error,
                src=self.src,
                waited_at=self.waited_at,
                eager=rec.eager,
                deferred=rec.deferred,
                dropped=self.dropped,
                keys=None,
                tid=rec.tid,
                via=rec.via,
                wait_stack=self.wait_stack,
            )
        return op


_new = object.__new__
#: store calls that raised, kept per rank (their ops, for the timeout findings)
_FAILED_STORE_KEPT = 16


class Sink(Protocol):
    """Where a rank model reports its ops (the cross-rank matcher)."""

    def add(self, st: OpState) -> None: ...

    def done(self, st: OpState) -> None: ...

    def add_done(self, st: OpState) -> None: ...

    def add_done_many(self, sts: Sequence[OpState]) -> None: ...

    def undone(self, st: OpState) -> None: ...

    def resolved(self, st: OpState) -> None: ...

    def remove_rank(self, rank: int, ops: Iterable[OpState]) -> None: ...

    def resume(self, rank: int, ck: CheckpointRecord, open_ops: list[OpState]) -> None: ...

    def store_set(self, rank: int, key: str) -> None: ...


class RankModel:
    """One rank's ops and calls, from its records (see the module docstring).

    Attributes:
        ops: op id -> state, of the ops kept, in program order.
        n_ops: ops seen, a checkpoint's earlier ones included (the next op's index).
        n_records: records fed.
        n_failed, n_dropped: how many times an op was marked failed, or dropped (0:
            none of the ops kept is).
        resumed: the trace started at a checkpoint (its earlier history is absent).
    """

    __slots__ = (
        "activity_at",
        "ended",
        "ended_ops",
        "exit_error",
        "exit_stack",
        "last_state",
        "n_dropped",
        "n_failed",
        "n_ops",
        "n_records",
        "newgroups",
        "nonmember",
        "open_calls",
        "ops",
        "rank",
        "resumed",
        "rewaits",
        "sink",
        "state_at",
        "store_calls",
        "store_failed",
        "store_keys",
        "thread_errors",
        "threads",
        "waits",
    )

    def __init__(self, rank: int, sink: Sink) -> None:
        self.rank = rank
        self.sink = sink
        # one dict for the model's life (cleared on a restart): the matcher folds from it
        self.ops: dict[int, OpState] = {}
        self._reset()

    def _reset(self) -> None:
        self.ops.clear()
        self.n_ops = 0
        self.n_records = 0
        self.n_failed = 0  # errors and drops marked on ops (a gate for reading them)
        self.n_dropped = 0
        self.resumed = False
        self.waits: dict[int, int] = {}  # open wait id -> op id
        # open waits on a send or receive whose earlier wait returned: id -> the op (kept
        # here: its finished pair may be folded meanwhile) and the wait's stack
        self.rewaits: dict[int, tuple[Op, tuple[Frame, ...]]] = {}
        self.open_calls: dict[int, None] = {}  # op / wait ids entered, not returned, in order
        self.newgroups: list[NewGroupRecord] = []
        self.nonmember: list[NonMemberRecord] = []
        self.ended: str | None = None
        self.ended_ops = 0  # the rank's ops before its last ``end``
        self.threads = 0  # threads of the user's code alive besides the main one
        self.thread_errors: list[ThreadErrorRecord] = []  # threads an exception ended
        self.exit_error: str | None = None  # the uncaught exception that ended it
        self.exit_stack: tuple[Frame, ...] = ()  # where it was raised
        # store calls that wait for keys, entered and not returned: id -> (record, the
        # number of the rank's ops before it, its record position); and the store keys
        # the rank set
        self.store_calls: dict[int, tuple[StoreRecord, int, int]] = {}
        # store calls that waited for keys and raised (a timeout): their ops, with the error
        self.store_failed: list[Op] = []
        self.store_keys: set[str] = set()
        self.last_state: StateRecord | None = None
        self.state_at = -1  # record position of last_state
        self.activity_at = -1  # record position of the last op, wait or ret

    # -- records -----------------------------------------------------------------------

    def feed(self, records: Iterable[ModelRecord]) -> None:
        """Apply records that follow the ones fed so far.

        The hot path (op, ret, wait) is written out here, with the record's class
        compared once: it runs for every record of every trace.  The commonest unit,
        an op whose call returned, then a wait on it that returned (a blocking call:
        op, ret, wait, ret, without error, wildcard sender or eager send), is taken in
        one step, with the same outcome as record by record.
        """
        if not isinstance(records, list | tuple):
            records = list(records)
        ops = self.ops
        waits = self.waits
        calls = self.open_calls
        sink = self.sink
        add_done = sink.add_done
        rank = self.rank
        at = self.n_records
        n_ops = self.n_ops
        active = self.activity_at
        complete_on_return = _COMPLETE_ON_RETURN
        n = len(records)
        last = n - 2  # the op of a unit of 4 records lies before this
        i = 0
        while i < n:
            rec = records[i]
            i += 1
            kind = type(rec)
            if kind is OpRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, OpRecord)
                if rec.id in ops:
                    # a damaged trace (an op id written twice): the later op is dropped,
                    # its ret and waits fall on the first
                    at += 1
                    continue
                if i < last:
                    rid = rec.id
                    ret = records[i]
                    wait = records[i + 1]
                    back = records[i + 2]
                    if (
                        type(ret) is RetRecord
                        and ret.id == rid
                        and ret.err is None
                        and type(wait) is WaitRecord
                        and wait.work == rid
                        and type(back) is RetRecord
                        and back.id == wait.id
                        and back.err is None
                        and back.src is None
                        and not rec.eager
                        and rec.op not in complete_on_return
                        and rid not in waits
                    ):
                        # issued, waited on at once, completed: what the four records
                        # do one by one (the open calls and waits they enter and leave)
                        if calls:
                            calls.pop(rid, None)
                            calls.pop(wait.id, None)
                        if waits:
                            waits.pop(wait.id, None)
                        n_ops += 1
                        st = OpState(rec, rank, n_ops - 1, -1, True, True, None, None, n_ops)
                        if wait.stack is not rec.stack and wait.stack != rec.stack:
                            st.wait_stack = wait.stack  # waited on at another line
                        ops[rid] = st
                        active = at + 3
                        at += 4
                        i += 3
                        add_done(st)
                        continue
                st = OpState(rec, rank, n_ops)
                n_ops += 1
                ops[rec.id] = st
                calls[rec.id] = None
                active = at
                sink.add(st)
            elif kind is RetRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, RetRecord)
                rid = rec.id
                calls.pop(rid, None)
                work = waits.pop(rid, None)
                if self.rewaits:
                    self.rewaits.pop(rid, None)
                target = ops.get(rid if work is None else work)
                active = at
                if target is None:
                    call = self.store_calls.pop(rid, None)
                    if call is not None and rec.err and len(self.store_failed) < _FAILED_STORE_KEPT:
                        failed = replace(store_op(self.rank, call[0], call[1]), error=rec.err)
                        self.store_failed.append(failed)
                elif work is None:
                    self._returned(target, rec.err)
                elif rec.err:
                    if target.done:
                        sink.undone(target)
                    target.error = rec.err
                    self.n_failed += 1
                    target.cached = None
                elif rec.src is None and target.issued and not target.completed:
                    target.completed = True  # the common case: a wait returned
                    target.cached = None
                    if target.error is None:
                        sink.done(target)
                else:
                    self._complete(target, rec.src)
            elif kind is WaitRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, WaitRecord)
                waits[rec.id] = rec.work
                target = ops.get(rec.work)
                if target is not None:
                    if target.waited_at is None:
                        target.waited_at = n_ops
                        if rec.stack != target.rec.stack:
                            target.wait_stack = rec.stack
                        target.cached = None
                    elif (
                        target.completed
                        and target.rec.op in P2P_OPS
                        and target.done
                        and not target.rec.eager
                    ):
                        # a send or receive waited on again after a wait returned: see
                        # blocked (one completed by a ``done`` alone was never waited on)
                        self.rewaits[rec.id] = (target.op(), rec.stack)
                calls[rec.id] = None
                active = at
            elif kind is DoneRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, DoneRecord)
                target = ops.get(rec.id)
                # a work whose wait raised (its peer died) is also "completed" to gloo: an
                # older recorder wrote a ``done`` for it after the failed wait's ``ret``
                if target is not None and target.error is None:
                    self._complete(target, rec.src)
            elif kind is DropRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, DropRecord)
                target = ops.get(rec.id)
                if target is not None and not target.completed:
                    target.dropped = True
                    self.n_dropped += 1
                    target.cached = None
            elif kind is StateRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, StateRecord)
                self.last_state = rec
                self.state_at = at
            elif kind is StoreRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, StoreRecord)
                active = at
                if rec.block:
                    self.store_calls[rec.id] = (rec, n_ops, at)
                    calls[rec.id] = None
                else:
                    self._store_set(rec)
            elif kind is NewGroupRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, NewGroupRecord)
                self.newgroups.append(rec)
            elif kind is NonMemberRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, NonMemberRecord)
                self.nonmember.append(rec)
            elif kind is ThreadsRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, ThreadsRecord)
                self.threads = rec.live
            elif kind is ThreadErrorRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, ThreadErrorRecord)
                died = (rec.tid, rec.name, rec.err, rec.stack)
                if all((e.tid, e.name, e.err, e.stack) != died for e in self.thread_errors):
                    self.thread_errors.append(rec)  # once: it is repeated after checkpoints
            elif kind is EndRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, EndRecord)
                self.ended = rec.how
                self.ended_ops = n_ops
                self.exit_error = rec.err
                self.exit_stack = rec.stack
            elif kind is CheckpointRecord:
                if TYPE_CHECKING:
                    assert isinstance(rec, CheckpointRecord)
                self.n_records, self.n_ops, self.activity_at = at, n_ops, active
                self._checkpoint(rec)
                ops, waits, calls = self.ops, self.waits, self.open_calls
                n_ops, active = self.n_ops, self.activity_at
            at += 1
        self.n_records = at
        self.n_ops = n_ops
        self.activity_at = active
        if self.ended == "destroy" and n_ops > self.ended_ops:
            self.ended = None  # ops after destroy (init_process_group again): it goes on

    def feed_calls(self, ops: Sequence[OpRecord], wait_ids: Sequence[int] | None = None) -> None:
        """Blocking calls that follow the records fed so far: ``ops[k]`` and
        ``wait_ids[k]`` stand for the four records ``op``, ``ret`` of it (no ``err``),
        ``wait`` (id ``wait_ids[k]``, None: the op's id + 1, on it), ``ret`` of the wait
        (no ``err``, no ``src``), with the outcome of :meth:`feed` of those records
        (their times, threads and stacks are not read)."""
        waits = self.waits
        calls = self.open_calls
        model_ops = self.ops
        add_done_many = self.sink.add_done_many
        rank = self.rank
        complete_on_return = _COMPLETE_ON_RETURN
        # the counters in locals, written back before a call fed record by record and
        # at the end (the matcher reads none of them); the new ops go to the matcher
        # together, before such a call and at the end
        n_ops, n_records, active = self.n_ops, self.n_records, self.activity_at
        done: list[OpState] = []
        if wait_ids is not None and len(wait_ids) != len(ops):
            raise ValueError("one wait id per op")
        for index, rec in enumerate(ops):
            rid = rec.id
            wait_id = rid + 1 if wait_ids is None else wait_ids[index]
            if rec.eager or rec.op in complete_on_return or rid in waits or rid in model_ops:
                # not a plain blocking call: its records, one by one
                if done:
                    add_done_many(done)
                    done = []
                self.n_ops, self.n_records, self.activity_at = n_ops, n_records, active
                self.feed(
                    (
                        rec,
                        RetRecord(id=rid),
                        WaitRecord(id=wait_id, work=rid),
                        RetRecord(id=wait_id),
                    )
                )
                n_ops, n_records, active = self.n_ops, self.n_records, self.activity_at
                continue
            if calls:
                calls.pop(rid, None)
                calls.pop(wait_id, None)
            if waits:
                waits.pop(wait_id, None)
            st = OpState(rec, rank, n_ops, -1, True, True, None, None, n_ops + 1)
            n_ops += 1
            active = n_records + 3  # the wait's ret
            n_records += 4
            model_ops[rid] = st
            done.append(st)
        if done:
            add_done_many(done)
        self.n_ops, self.n_records, self.activity_at = n_ops, n_records, active
        if self.ended == "destroy" and ops:
            self.ended = None  # ops after destroy (init_process_group again): it goes on

    def _store_set(self, rec: StoreRecord) -> None:
        """A store call that sets keys (set, add, ...): they exist from now on."""
        namespace = rec.namespace
        if namespace is None or rec.op not in STORE_SETS:
            return
        for key in rec.keys:
            name = store_key(namespace, key)
            if name not in self.store_keys:
                self.store_keys.add(name)
                self.sink.store_set(self.rank, name)

    def _returned(self, st: OpState, err: str | None) -> None:
        """An op's call returned: it is issued (complete, for some ops)."""
        was = st.done
        st.issued = True
        st.cached = None
        op = st.rec
        if err:
            st.error = err
            self.n_failed += 1
        elif op.eager or (not op.is_async and op.op in _COMPLETE_ON_RETURN):
            st.completed = True  # an eager send completes on issue
        if not was and st.done:
            self.sink.done(st)
        elif was and not st.done:
            self.sink.undone(st)

    def _complete(self, st: OpState, src: int | None) -> None:
        was = st.done
        st.completed = True
        st.cached = None
        if src is not None:
            wildcard = st.pending_wildcard
            st.src = src
            if wildcard:
                self.sink.resolved(st)
        if not was and st.done:
            self.sink.done(st)

    # -- checkpoints -------------------------------------------------------------------

    def _checkpoint(self, ck: CheckpointRecord) -> None:
        """Start at a checkpoint; one that follows this rank's history seamlessly (the
        whole trace is read, segment after segment) changes nothing."""
        if self.n_records and ck.ops_before == self.n_ops:
            return
        if self.n_records:  # a gap in the history: restart from the checkpoint
            self.sink.remove_rank(self.rank, self.ops.values())
            self._reset()
        self.resumed = True
        self.n_ops = ck.ops_before
        issued = set(ck.issued)
        first = ck.ops_before - len(ck.open)
        opened: list[OpState] = []
        for j, rec in enumerate(ck.open):
            st = OpState(rec, self.rank, first + j)
            st.issued = rec.id in issued
            self.ops[rec.id] = st
            opened.append(st)
        self.sink.resume(self.rank, ck, opened)
        entered = [(r.t, r.id) for r in ck.open if r.id not in issued]
        entered += [(w.t, w.id) for w in ck.waits]
        entered += [(c.t, c.id) for c in ck.stores]
        for _, call in sorted(entered):
            self.open_calls[call] = None
        for wait in ck.waits:
            self.waits[wait.id] = wait.work
            target = self.ops.get(wait.work)
            if target is not None and target.waited_at is None:
                target.waited_at = ck.ops_before
                if wait.stack != target.rec.stack:
                    target.wait_stack = wait.stack  # as feed() keeps it
                target.cached = None
        for oid in ck.dropped:
            target = self.ops.get(oid)
            if target is not None:
                target.dropped = True
        for store_call in ck.stores:
            self.store_calls[store_call.id] = (store_call, ck.ops_before, self.n_records)

    # -- the rank's state --------------------------------------------------------------

    def may_wait(self) -> bool:
        """Whether the rank may be blocked: inside a call, or last seen by its watchdog
        stalled on pending works.  A rank for which this is false is not blocked."""
        if self.ended is not None:
            return False
        if self.open_calls:
            return True
        state = self.last_state
        return (
            state is not None
            and self.state_at > self.activity_at
            and stall_kind(state.where, state.pending) is not None
        )

    def blocked(self) -> Blocked | None:
        """What the rank is stuck in at the end of what was read: the innermost open
        call decides; else a watchdog stall report newer than the last call."""
        if self.ended is not None:
            return None
        ops = self.ops
        last = self._innermost_call() if self.open_calls else None
        if last is not None:
            call = self.store_calls.get(last)
            if call is not None:
                return Blocked((store_op(self.rank, call[0], call[1]),), "call")
            if last in self.waits:
                again = self.rewaits.get(last)
                if again is not None:
                    # a wait on a send or receive whose earlier wait returned: gloo's
                    # wait() waits for one more message each call, so this one never
                    # returns (a collective's, or an NCCL work's, returns at once); the
                    # op is named where this wait is, ``earlier`` where the first was
                    op, stack = again
                    now = replace(op, wait_stack=stack) if stack else op
                    return Blocked((now,), "rewait", earlier=op.wait_stack or op.stack)
                target = ops.get(self.waits[last])
                return Blocked((target.op(),), "wait") if target is not None else None
            st = ops.get(last)
            if st is not None and st.rec.deferred and st.rec.batch is not None:
                # Inside a fused batch waiting for its launch: it needs every op of it.
                batch = st.rec.batch
                members = (ops.get(i) for i in self.open_calls)
                return Blocked(
                    tuple(
                        o.op()
                        for o in members
                        if o is not None and o.rec.deferred and o.rec.batch == batch
                    ),
                    "call",
                )
            if st is not None:
                return Blocked((st.op(),), "call")
        state = self.last_state
        if state is None or self.state_at <= self.activity_at:
            return None
        how = stall_kind(state.where, state.pending)
        if how is None:
            return None
        pending = tuple(
            o.op() for i in state.pending if (o := ops.get(i)) is not None and not o.completed
        )
        return Blocked(pending, how) if pending else None

    def _innermost_call(self) -> int | None:
        """The innermost open call that holds the rank.

        An open op or wait comes first: the thread that issues the rank's communication
        is in it.  A store wait holds the rank only when no op or wait is open, once the
        watchdog, looking at that thread after the wait began, found it inside
        communication ("comm": the wait's own frame), and while nothing was recorded
        since the wait began.  Otherwise another thread waits in it (a thread watching
        for a key, say) while the rank goes on: the wait is passed over.
        """
        store_calls = self.store_calls
        state = self.last_state
        held = None
        for call_id in reversed(self.open_calls):
            call = store_calls.get(call_id)
            if call is None:
                return call_id
            at = call[2]
            if (
                held is None
                and at >= self.activity_at
                and state is not None
                and self.state_at > at
                and state.where == "comm"
            ):
                held = call_id
        return held

    def timeline(self, truncated: bool, check: Callable[[], None]) -> Timeline:
        """The rank's timeline; ``check`` guards the ops, which are built on first use,
        against a model that moved on since."""
        kept = self.ops

        def ops() -> tuple[Op, ...]:
            check()
            return tuple(st.op() for st in kept.values())

        return Timeline(
            rank=self.rank,
            source=ops,
            blocked=self.blocked(),
            ended=self.ended,
            exit_error=self.exit_error,
            exit_stack=self.exit_stack,
            threads=self.threads,
            thread_errors=tuple(self.thread_errors),
            newgroups=tuple(self.newgroups),
            store_keys=frozenset(self.store_keys),
            nonmember_calls=tuple(self.nonmember),
            last_state=self.last_state,
            record_count=self.n_records,
            truncated=truncated,
        )
