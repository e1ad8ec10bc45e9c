"""Operations and per-rank timelines: what the model tells of each rank (no I/O, no
matching; :mod:`dl2.model.rank_state` builds them from records)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from functools import cached_property

from dl2.trace.schema import NO_RANK
from dl2.trace.schema.decode import Frame as Frame  # re-exported: the model's frames
from dl2.trace.schema.decode import NewGroupRecord
from dl2.trace.schema.decode import NonMemberRecord
from dl2.trace.schema.decode import StateRecord
from dl2.trace.schema.decode import StoreRecord
from dl2.trace.schema.decode import ThreadErrorRecord
from dl2.trace.schema.decode import caller_frame
from dl2.trace.schema.decode import package_frame
from dl2.trace.schema.decode import report_frame

#: Collectives whose recorded element count must agree across members: the input of
#: each rank (a gather's too: every rank contributes a slot of the same size), a
#: scatter's output (only the root has inputs), the sum over a coalesced call's tensors.
SAME_COUNT_OPS = frozenset(
    {
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "all_gather_into_tensor",
        "gather",
        "scatter",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_reduce_coalesced",
        "all_gather_coalesced",
        "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced",
    }
)
P2P_OPS = frozenset({"send", "recv"})
GROUP_OPS = frozenset({"create_group"})
#: Ops that carry no tensor, so dtype and count are not compared.
NO_DATA_OPS = frozenset({"barrier", "monitored_barrier"})
#: The prefix of the op of a c10d Store call that waits for keys (``store_get``,
#: ``store_wait``, ``store_multi_get``): see :func:`store_op`.
STORE_PREFIX = "store_"


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
    #: an async send or receive whose work its rank dropped before it completed, never
    #: waited (a ``drop`` record): gloo never moves the message
    dropped: bool = False
    #: a store op: the keys it waits for, as the caller named them (the op's ``gid``
    #: is the store's namespace, see :func:`store_key`)
    keys: tuple[str, ...] | None = None
    #: the thread that issued it (0: unknown): program order holds within a thread
    tid: int = 0
    #: a P2P op whose peer the program computed from the sender that wildcard receive
    #: ``via`` (an op id of the same rank) returned
    via: int | None = None
    #: where the rank first waited on it (``work.wait()``), when not where it was issued
    wait_stack: tuple[Frame, ...] = ()

    @property
    def kind(self) -> str:
        """ "p2p", "group", "store" or "collective"."""
        if self.op in P2P_OPS:
            return "p2p"
        if self.op in GROUP_OPS:
            return "group"
        if self.op.startswith(STORE_PREFIX):
            return "store"
        return "collective"

    @property
    def frame(self) -> Frame | None:
        """The line to name (:func:`~dl2.trace.schema.decode.report_frame`)."""
        return report_frame(self.stack)

    @property
    def caller_frame(self) -> Frame | None:
        """The program's line that led to :attr:`frame`, when in another file."""
        return caller_frame(self.stack)

    @property
    def package_frame(self) -> Frame | None:
        """The installed package's line :attr:`frame` called into, if any."""
        return package_frame(self.stack)

    @property
    def wait_frame(self) -> Frame | None:
        """The line of the first wait on it, when it was not issued there."""
        return report_frame(self.wait_stack) if self.wait_stack else None

    @property
    def signature(self) -> str:
        """Short human signature: ``float32[1024] sum root=0``; a store op's keys."""
        if self.keys is not None:
            return ", ".join(repr(k) for k in self.keys)
        parts: list[str] = []
        if self.dtype is not None:
            parts.append(f"{self.dtype}[{self.count if self.count is not None else '?'}]")
        if self.redop:
            parts.append(self.redop)
        if self.root is not None:
            parts.append(f"root={self.root}" if self.root != NO_RANK else "root=(no rank)")
        if self.tag:
            parts.append(f"tag={self.tag}")
        return " ".join(parts)


@dataclass(frozen=True)
class Blocked:
    """What a rank is stuck in at the end of its trace.

    Attributes:
        ops: the ops it needs to complete (one for a wait or an open call; several
            for a watchdog-reported stall on pending async works).
        how: "wait" (in Work.wait), "rewait" (in a second Work.wait on a send or
            receive whose first returned), "call" (inside the call itself), "stall"
            (the watchdog saw the main thread inside backward/communication) or "poll"
            (the watchdog saw it spin polling ``is_completed()`` on these works).
    """

    ops: tuple[Op, ...]
    how: str
    #: for a "rewait": the stack of the earlier wait on the op, which returned
    earlier: tuple[Frame, ...] = ()


@dataclass(frozen=True, eq=False)
class Timeline:
    """One rank's ops in program order and its final blocking state.

    ``ops`` are the ops the model keeps of the rank: every op, unless the history was
    folded (:mod:`dl2.model.incremental`) or the trace starts at a checkpoint; they are
    built from ``source`` on first use, so that reading a rank's state (``blocked``,
    ``ended``, ``last_state``) costs nothing in the length of its history.

    Attributes:
        rank: the rank.
        blocked: what it is stuck in at the end of its trace, if anything.
        ended: "exit" or "destroy" from an end record.
        exit_error, exit_stack: the uncaught exception that ended the rank's program
            ("Type: message"), and the user's stack where it was raised.
        threads: threads of the user's own code alive besides the main one: while
            there are, a blocked call of one thread may be released by another.
        thread_errors: its threads that an uncaught exception ended.
        store_keys: the store keys the rank set (:func:`store_key`).
        newgroups, nonmember_calls: its new_group and non-member call records.
        last_state: its watchdog's latest ``state`` record.
        record_count: records read of its trace.
        truncated: its trace ends in a partial record.
        source: the ops, or what builds them.
    """

    rank: int
    blocked: Blocked | None
    ended: str | None
    exit_error: str | None = None
    exit_stack: tuple[Frame, ...] = ()
    threads: int = 0
    thread_errors: tuple[ThreadErrorRecord, ...] = ()
    newgroups: tuple[NewGroupRecord, ...] = ()
    store_keys: frozenset[str] = frozenset()
    nonmember_calls: tuple[NonMemberRecord, ...] = ()
    last_state: StateRecord | None = None
    record_count: int = 0
    truncated: bool = False
    source: tuple[Op, ...] | Callable[[], tuple[Op, ...]] = field(default=(), repr=False)

    @cached_property
    def ops(self) -> tuple[Op, ...]:
        return self.source if isinstance(self.source, tuple) else self.source()

    @cached_property
    def by_id(self) -> dict[int, Op]:
        """op id -> op, of the ops kept."""
        return {op.id: op for op in self.ops}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timeline):
            return NotImplemented
        return self._compared() == other._compared()

    __hash__ = None  # type: ignore[assignment]

    def _compared(self) -> tuple[object, ...]:
        """What equality compares: every field, with the ops in place of their source."""
        return (
            self.rank,
            self.ops,
            self.blocked,
            self.ended,
            self.exit_error,
            self.exit_stack,
            self.threads,
            self.thread_errors,
            self.newgroups,
            self.store_keys,
            self.nonmember_calls,
            self.last_state,
            self.record_count,
            self.truncated,
        )


def store_op(rank: int, rec: StoreRecord, index: int) -> Op:
    """The op of a c10d Store call that waits for its keys (a ``store`` record with
    ``block``): ``store_get`` and so on, on the "group" that is the store's namespace
    ("?" when the store cannot be told), ``index`` the number of the rank's ops before."""
    return Op(
        rank=rank,
        id=rec.id,
        op=STORE_PREFIX + rec.op,
        gid=rec.namespace or "?",
        index=index,
        api=rec.op,
        timeout=rec.timeout,
        stack=rec.stack,
        keys=rec.keys,
        tid=rec.tid,
    )


def store_key(namespace: str, key: str) -> str:
    """A key as every rank names it: its store's namespace (the store and the prefixes in
    front of the key, :attr:`~dl2.trace.schema.decode.StoreRecord.namespace`) and the key."""
    return namespace + key
