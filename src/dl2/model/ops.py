"""Operations and per-rank timelines rebuilt from trace records (no I/O, no matching)."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field

from dl2.model.stuck import stall_kind
from dl2.trace.format import RankTrace
from dl2.trace.schema.decode import DoneRecord
from dl2.trace.schema.decode import EndRecord
from dl2.trace.schema.decode import Frame as Frame  # re-exported: the model's frames
from dl2.trace.schema.decode import NewGroupRecord
from dl2.trace.schema.decode import NonMemberRecord
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import StateRecord
from dl2.trace.schema.decode import WaitRecord
from dl2.trace.schema.decode import report_frame

#: Collectives whose per-rank input element count must agree across members.
SAME_COUNT_OPS = frozenset(
    {
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_reduce_coalesced",
    }
)
P2P_OPS = frozenset({"send", "recv"})
GROUP_OPS = frozenset({"create_group"})
#: Ops that carry no tensor, so dtype and count are not compared.
NO_DATA_OPS = frozenset({"barrier", "monitored_barrier"})


@dataclass(frozen=True)
class Op:
    """One communication call of one rank, with what the trace says of its fate.

    ``issued`` means the call returned (for P2P and collectives: the work exists);
    ``completed`` means a wait on it returned or the watchdog saw it done.
    """

    rank: int
    id: int
    op: str
    gid: str
    index: int  # position in the rank's file order of ops (program order)
    seq: int | None = None
    api: str | None = None
    peer: int | None = None
    root: int | None = None
    tag: int | None = None
    redop: str | None = None
    dtype: str | None = None
    count: int | None = None
    splits: tuple[tuple[int, ...], ...] | None = None
    ranks: tuple[int, ...] | None = None
    #: monitored_barrier: its timeout (s), past which it raises instead of waiting on
    timeout: float | None = None
    is_async: bool = False
    batch: int | None = None  # ops of one batch_isend_irecv / coalescing block share it
    stack: tuple[Frame, ...] = ()
    issued: bool = False
    completed: bool = False
    error: str | None = None
    src: int | None = None  # matched sender of a completed wildcard recv
    #: where the rank first waited on it: the number of its ops issued before that
    #: ``wait`` record (so at least ``index + 1``); None if the trace has no wait on it
    waited_at: int | None = None
    #: an eager send (``dl2 run --buffer-size``): complete for its rank once issued,
    #: whether or not the peer has received it yet
    eager: bool = False
    #: a P2P op of a batch under fused-batch emulation: issued only when its whole
    #: batch can launch (until its ``ret``, its rank sits in the batch call)
    deferred: bool = False

    @property
    def kind(self) -> str:
        """ "p2p", "group" or "collective"."""
        if self.op in P2P_OPS:
            return "p2p"
        if self.op in GROUP_OPS:
            return "group"
        return "collective"

    @property
    def frame(self) -> Frame | None:
        """The line to name (:func:`~dl2.trace.schema.decode.report_frame`)."""
        return report_frame(self.stack)

    @property
    def signature(self) -> str:
        """Short human signature: ``float32[1024] sum root=0``."""
        parts: list[str] = []
        if self.dtype is not None:
            parts.append(f"{self.dtype}[{self.count if self.count is not None else '?'}]")
        if self.redop:
            parts.append(self.redop)
        if self.root is not None:
            parts.append(f"root={self.root}")
        if self.tag:
            parts.append(f"tag={self.tag}")
        return " ".join(parts)


@dataclass(frozen=True)
class Blocked:
    """What a rank is stuck in at the end of its trace.

    Attributes:
        ops: the ops it needs to complete (one for a wait or an open call; several
            for a watchdog-reported stall on pending async works).
        how: "wait" (in Work.wait), "call" (inside the call itself), "stall"
            (the watchdog saw the main thread inside backward/communication) or "poll"
            (the watchdog saw it spin polling ``is_completed()`` on these works).
    """

    ops: tuple[Op, ...]
    how: str


@dataclass(frozen=True)
class Timeline:
    """One rank's ops in program order and its final blocking state."""

    rank: int
    ops: tuple[Op, ...]
    blocked: Blocked | None
    ended: str | None  # "exit" or "destroy" from an end record
    newgroups: tuple[NewGroupRecord, ...] = ()
    nonmember_calls: tuple[NonMemberRecord, ...] = ()
    last_state: StateRecord | None = None
    record_count: int = 0
    truncated: bool = False
    by_id: dict[int, Op] = field(default_factory=dict, compare=False, repr=False)


@dataclass
class _Fate:
    """What the records after an op say of it."""

    record: OpRecord
    issued: bool = False
    completed: bool = False
    error: str | None = None
    src: int | None = None
    waited_at: int | None = None


def build_timeline(trace: RankTrace) -> Timeline:
    """Rebuild one rank's ops and final state from its records."""
    rank = trace.rank
    fates: dict[int, _Fate] = {}
    order: list[int] = []
    waits: dict[int, int] = {}  # wait id -> op id
    open_calls: list[int] = []  # op or wait ids entered and not returned, in order
    newgroups: list[NewGroupRecord] = []
    nonmember: list[NonMemberRecord] = []
    ended: str | None = None
    last_state: StateRecord | None = None
    last_state_pos = -1
    last_activity_pos = -1
    for pos, rec in enumerate(trace.records):
        if isinstance(rec, OpRecord):
            fates[rec.id] = _Fate(rec)
            order.append(rec.id)
            open_calls.append(rec.id)
            last_activity_pos = pos
        elif isinstance(rec, WaitRecord):
            waits[rec.id] = rec.work
            target = fates.get(rec.work)
            if target is not None and target.waited_at is None:
                target.waited_at = len(order)
            open_calls.append(rec.id)
            last_activity_pos = pos
        elif isinstance(rec, RetRecord):
            rid = rec.id
            if rid in open_calls:
                open_calls.remove(rid)
            if rid in waits:
                target = fates.get(waits[rid])
                if target is not None and rec.err:
                    target.error = rec.err
                elif target is not None:
                    target.completed = True
                    if rec.src is not None:
                        target.src = rec.src
            elif rid in fates:
                fate = fates[rid]
                fate.issued = True
                if rec.err:
                    fate.error = rec.err
                elif fate.record.eager:
                    fate.completed = True  # an eager send completes on issue
                elif not fate.record.is_async and fate.record.op in (
                    "create_group",
                    "monitored_barrier",
                ):
                    fate.completed = True
            last_activity_pos = pos
        elif isinstance(rec, DoneRecord) and rec.id in fates:
            fates[rec.id].completed = True
            if rec.src is not None:
                fates[rec.id].src = rec.src
        elif isinstance(rec, NewGroupRecord):
            newgroups.append(rec)
        elif isinstance(rec, NonMemberRecord):
            nonmember.append(rec)
        elif isinstance(rec, StateRecord):
            last_state, last_state_pos = rec, pos
        elif isinstance(rec, EndRecord):
            ended = rec.how

    ops: list[Op] = []
    by_id: dict[int, Op] = {}
    for index, op_id in enumerate(order):
        fate = fates[op_id]
        rec = fate.record
        op = Op(
            rank=rank,
            id=op_id,
            op=rec.op,
            gid=rec.gid,
            index=index,
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
            issued=fate.issued,
            completed=fate.completed,
            error=fate.error,
            src=fate.src,
            waited_at=fate.waited_at,
            eager=rec.eager,
            deferred=rec.deferred,
        )
        ops.append(op)
        by_id[op_id] = op

    blocked = _final_block(open_calls, waits, by_id, last_state, last_state_pos, last_activity_pos)
    return Timeline(
        rank=rank,
        ops=tuple(ops),
        blocked=blocked if ended is None else None,
        ended=ended,
        newgroups=tuple(newgroups),
        nonmember_calls=tuple(nonmember),
        last_state=last_state,
        record_count=len(trace.records),
        truncated=trace.truncated is not None,
        by_id=by_id,
    )


def _final_block(
    open_calls: list[int],
    waits: dict[int, int],
    by_id: dict[int, Op],
    last_state: StateRecord | None,
    last_state_pos: int,
    last_activity_pos: int,
) -> Blocked | None:
    """The innermost open call decides; else a fresh watchdog stall report."""
    if open_calls:
        last = open_calls[-1]
        if last in waits:
            target = by_id.get(waits[last])
            return Blocked((target,), "wait") if target is not None else None
        op = by_id.get(last)
        if op is not None and op.deferred and op.batch is not None:
            # Inside a fused batch waiting for its launch: it needs every op of the batch.
            batch = tuple(
                o
                for i in open_calls
                if (o := by_id.get(i)) is not None and o.deferred and o.batch == op.batch
            )
            return Blocked(batch, "call")
        if op is not None:
            return Blocked((op,), "call")
    if last_state is None or last_state_pos <= last_activity_pos:
        return None
    how = stall_kind(last_state.where, last_state.pending)
    if how is None:
        return None
    pending = [by_id[i] for i in last_state.pending if i in by_id and not by_id[i].completed]
    return Blocked(tuple(pending), how) if pending else None
