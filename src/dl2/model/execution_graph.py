"""The execution graph: every rank's ops in program order plus the cross-rank matches.

Collectives are matched per process group by position: the i-th collective a member
issues on a group meets the i-th of every other member.  P2P ops are matched per
channel (:func:`dl2.model.program.channel_of`: group, sender, receiver, tag) in order
(gloo and MPI do not let messages overtake); a wildcard receive meets the sender
recorded when it completed, or the earliest unmatched send to it while it is still
pending.

An :class:`ExecutionGraph` is a read-only view of the incremental model
(:class:`dl2.model.incremental.Model`) at one moment: what it holds is built on first
use, so that reading a few ranks' state costs nothing in the length of the history or
in the size of the world.  Reading a view after its model was fed more records raises
:class:`StaleGraphError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

from dl2.model.ops import NO_DATA_OPS
from dl2.model.ops import P2P_OPS
from dl2.model.ops import SAME_COUNT_OPS
from dl2.model.ops import Op
from dl2.model.ops import Timeline
from dl2.model.program import Mailbox
from dl2.trace.session import Session

if TYPE_CHECKING:
    from dl2.model.incremental import Model
    from dl2.model.rank_state import OpState

OpKey = tuple[int, int]  # (rank, op id)


def op_key(op: Op) -> OpKey:
    return (op.rank, op.id)


class Signed(Protocol):
    """What matching compares of a collective: an :class:`Op` or its record."""

    @property
    def op(self) -> str: ...

    @property
    def root(self) -> int | None: ...

    @property
    def redop(self) -> str | None: ...

    @property
    def dtype(self) -> str | None: ...

    @property
    def count(self) -> int | None: ...

    @property
    def splits(self) -> tuple[tuple[int, ...], ...] | None: ...


#: Collectives that meet each other as one (the same gloo and NCCL collective, a list of
#: tensors or one flat tensor): a list all_gather on one rank and all_gather_into_tensor
#: on another complete, with the right data.  Not reduce_scatter: gloo runs the list
#: form and reduce_scatter_tensor as different algorithms, and aborts on the sizes.
_SAME_COLLECTIVE = {
    "all_gather_into_tensor": "all_gather",
}


def signature_fields(op: Signed) -> dict[str, object]:
    """The fields that must agree between members for a collective to match."""
    fields: dict[str, object] = {"op": _SAME_COLLECTIVE.get(op.op, op.op)}
    if op.root is not None or op.op in ("broadcast", "reduce", "gather", "scatter"):
        fields["root"] = op.root
    if op.redop is not None:
        fields["redop"] = op.redop
    if op.op not in NO_DATA_OPS:
        fields["dtype"] = op.dtype
    if op.op in SAME_COUNT_OPS:
        fields["count"] = op.count
    if op.op in ("all_reduce_coalesced", "reduce_scatter") and op.splits is not None:
        # the same tensors fused on every rank; the same shard for each rank
        fields["splits"] = op.splits
    return fields


EXCHANGE_OPS = frozenset({"all_to_all", "all_to_all_single"})


def _exchange_sizes_agree(ops: Mapping[int, Signed], members: tuple[int, ...]) -> bool:
    """Whether an all_to_all's split sizes pair up: what member i sends to member j
    (its input split j) is what j expects from i (its output split i)."""
    first = next(iter(ops.values()))
    if first.op not in EXCHANGE_OPS:
        return True
    splits = [ops[r].splits for r in members]
    n = len(members)
    if any(s is None or len(s) != 2 or len(s[0]) != n or len(s[1]) != n for s in splits):
        return True  # not recorded (or not comparable): nothing to say
    return all(
        splits[i][0][j] == splits[j][1][i]  # type: ignore[index]
        for i in range(n)
        for j in range(n)
    )


def call_key(op: Signed) -> tuple[object, ...]:
    """What the members' collectives at one position must agree on (of an
    :class:`~dl2.model.ops.Op` or the record it was read from)."""
    return (op.op, op.dtype, op.count, op.redop, op.root, op.splits)


def differing_fields(ops: Mapping[int, Signed], members: tuple[int, ...]) -> tuple[str, ...]:
    """The names of the fields on which a slot's ops disagree (one pass over them).

    "op" alone when the ops differ (their other fields are not comparable); else
    "split_sizes" when every member issued an all_to_all whose sizes do not pair up.
    """
    fields = [signature_fields(op) for op in ops.values()]
    first = fields[0]
    names = {name for f in fields for name in f}
    differing = tuple(sorted(n for n in names if any(f.get(n) != first.get(n) for f in fields)))
    if "op" in differing:
        return ("op",)
    if not differing and all(r in ops for r in members) and not _exchange_sizes_agree(ops, members):
        return ("split_sizes",)
    return differing


@dataclass(frozen=True)
class CollectiveSlot:
    """The i-th collective of a group across its members.

    Attributes:
        gid: group name; index: position on the group (0-based).
        ops: member rank -> the op it issued at this position.
        missing: members that have not issued an i-th collective (yet).
        differing: names of the fields on which the issued ops disagree.
    """

    gid: str
    index: int
    ops: Mapping[int, Op]
    missing: tuple[int, ...]
    differing: tuple[str, ...]

    @property
    def mismatched(self) -> bool:
        return bool(self.differing)


class StaleGraphError(RuntimeError):
    """An execution graph read after its model was fed more records."""


class ExecutionGraph:
    """Ops of all ranks with their cross-rank matches, as the model has them now.

    Attributes:
        timelines: rank -> its ops in program order and its final blocking state.
        groups: group name -> global ranks of its members.
        slots: group name -> its collective slots kept, in order (``slot.index`` is the
            position on the group; ``slots[gid][i]`` is the i-th slot *kept*).
        collective_slot: (rank, op id) -> (group, index) of a collective.
        p2p_partner: (rank, op id) -> the matching op on the peer.
        world_size: ranks of the job.
        folded_ops: ops folded away (finished and matched, beyond the model's window).
        op_count: every op of the traces, folded ones and those a checkpoint stands
            for included.
        resumed: ranks whose trace starts at a checkpoint (their history is absent).
    """

    def __init__(self, model: Model) -> None:
        self._model = model
        self._version = model.version
        self.world_size = model.world_size
        self.folded_ops = model.matcher.folded
        self.groups: Mapping[str, tuple[int, ...]] = model.matcher.groups()
        self.timelines: Mapping[int, Timeline] = _Timelines(self)
        self.slots: Mapping[str, tuple[CollectiveSlot, ...]] = _Slots(self)
        self.collective_slot: Mapping[OpKey, tuple[str, int]] = _Where(self)
        self.p2p_partner: Mapping[OpKey, Op] = _Partners(self)
        self._slot_cache: dict[tuple[str, int], CollectiveSlot | None] = {}
        #: what the wait-for graph derives once per slot and shares between the ranks
        #: blocked in it (see :func:`dl2.model.wait_for.clause_for`)
        self.shared_targets: dict[tuple[object, ...], tuple[int, ...]] = {}
        self._group_views: dict[str, dict[tuple[int, ...] | None, frozenset[int]]] | None = None
        self._mail: dict[Mailbox, dict[OpKey, OpState]] = {}  # wildcard matches read

    @cached_property
    def op_count(self) -> int:
        self.check()
        return self._model.op_count()

    @cached_property
    def follows_peers(self) -> bool:
        """Every trace marks the P2P ops whose peer came from a wildcard receive's
        sender (``Op.via``); in older traces such ops look like any other."""
        self.check()
        return self._model.follows_peers()

    @cached_property
    def follows_group_peers(self) -> bool:
        """:attr:`follows_peers`, for wildcard receives on subgroups too."""
        self.check()
        return self._model.follows_group_peers()

    @cached_property
    def resumed(self) -> frozenset[int]:
        self.check()
        return self._model.resumed()

    @property
    def complete(self) -> bool:
        """Every op of every rank is here: nothing folded, no rank resumed."""
        return not self.folded_ops and not self.resumed

    def check(self) -> None:
        """Raise :class:`StaleGraphError` if the model moved on since this view."""
        if self._model.version != self._version:
            raise StaleGraphError("the model was fed more records since this graph was taken")

    @cached_property
    def traced(self) -> tuple[int, ...]:
        """The ranks with a trace, ascending."""
        return tuple(sorted(self._model.ranks()))

    def waiting_ranks(self) -> tuple[int, ...]:
        """The ranks that may be blocked, ascending: every rank whose timeline's
        ``blocked`` is set is among them (the others are not inside any call)."""
        self.check()
        return tuple(sorted(self._model.waiting))

    def slot_at(self, gid: str, index: int) -> CollectiveSlot | None:
        """The collective slot at a position of a group, if kept."""
        key = (gid, index)
        if key not in self._slot_cache:
            self.check()
            self._slot_cache[key] = self._model.matcher.slot(gid, index)
        return self._slot_cache[key]

    def slot_of(self, op: Op) -> CollectiveSlot | None:
        where = self.collective_slot.get(op_key(op))
        return self.slot_at(*where) if where else None

    def divergent_slots(self) -> dict[str, tuple[CollectiveSlot, ...]]:
        """Per group (ascending), its slots that are mismatched or miss a member, in
        order: the only slots a finding names.  A glance at each slot kept; only these
        are built."""
        self.check()
        matcher = self._model.matcher
        found = {}
        for gid in sorted(matcher.slots):
            slots = (self.slot_at(gid, index) for index in matcher.unsettled(gid))
            found[gid] = tuple(s for s in slots if s is not None and (s.mismatched or s.missing))
        return found

    def open_ops(self, rank: int) -> tuple[Op, ...]:
        """The ops the rank is inside of, or waits on, in any thread, oldest first:
        O(its open calls), whatever its history."""
        self.check()
        model = self._model.rank_model(rank)
        if model is None:
            return ()
        waits, ops = model.waits, model.ops
        found = (ops.get(waits.get(call, call)) for call in model.open_calls)
        return tuple(st.op() for st in found if st is not None)

    def failed_ops(self, rank: int) -> tuple[Op, ...]:
        """The rank's ops that raised, in program order."""
        self.check()
        model = self._model.rank_model(rank)
        if model is None:
            return ()
        failed = (
            tuple(st.op() for st in model.ops.values() if st.error is not None)
            if model.n_failed
            else ()
        )
        return failed + tuple(model.store_failed)  # store waits that raised (a timeout)

    def dropped_ops(self, rank: int) -> tuple[Op, ...]:
        """The rank's ops whose work it dropped (``Op.dropped``), in program order."""
        self.check()
        model = self._model.rank_model(rank)
        if model is None or not model.n_dropped:
            return ()
        return tuple(st.op() for st in model.ops.values() if st.dropped)

    def issued(self, rank: int, op: str) -> bool:
        """Whether the rank issued an op named ``op`` among those kept (no op is built)."""
        self.check()
        model = self._model.rank_model(rank)
        return model is not None and any(st.rec.op == op for st in model.ops.values())

    def p2p_ops(self, rank: int) -> tuple[Op, ...]:
        """The rank's sends and receives, in program order."""
        self.check()
        model = self._model.rank_model(rank)
        if model is None or rank not in self._model.matcher.p2p_ranks:
            return ()
        return tuple(st.op() for st in model.ops.values() if st.rec.op in P2P_OPS)

    def p2p_issued(self, gid: str, sender: int, receiver: int) -> tuple[int, int]:
        """The sends and receives issued from ``sender`` to ``receiver`` on ``gid`` (every
        tag, folded ones included)."""
        self.check()
        return self._model.matcher.channels.issued(gid, sender, receiver)

    def p2p_unmatched(self, gid: str, sender: int, receiver: int, kind: str) -> tuple[Op, ...]:
        """The sends (``kind`` "send") or receives from ``sender`` to ``receiver`` on
        ``gid`` that nothing on the other side meets, in program order: O(those ops),
        whatever the history."""
        self.check()
        return tuple(
            st.op() for st in self._model.matcher.channels.unmatched(gid, sender, receiver, kind)
        )

    def issued_count(self, gid: str, rank: int) -> int:
        """How many collectives ``rank`` issued on group ``gid`` (folded ones included)."""
        self.check()
        return self._model.matcher.issued_count(gid, rank)

    def group_members(self, gid: str) -> tuple[int, ...]:
        """The members of a group; a group no trace created is taken as the world."""
        members = self.groups.get(gid)
        return members if members is not None else self._world_group

    def group_creators(self, gid: str, ranks: tuple[int, ...] | None) -> frozenset[int]:
        """The ranks whose trace creates the group ``gid`` of these ``ranks``."""
        return frozenset(self._model.matcher.creators.get((gid, ranks), ()))

    def group_views(self, gid: str) -> Mapping[tuple[int, ...] | None, frozenset[int]]:
        """The member lists the ranks that created ``gid`` gave it -> those ranks: more
        than one when the same group name means different groups on different ranks (they
        created groups in different orders)."""
        views = self._group_views
        if views is None:
            self.check()
            views = self._group_views = {}
            for (name, ranks), creators in self._model.matcher.creators.items():
                if creators:
                    views.setdefault(name, {})[ranks] = frozenset(creators)
        return views.get(gid, {})

    def store_key_may_exist(self, key: str) -> bool:
        """Whether a store key (:func:`dl2.model.ops.store_key`) may have been set: some
        rank set it, or some rank's trace starts at a checkpoint (whose earlier store
        calls are unknown).  Keys are never taken as deleted."""
        self.check()
        return bool(self._model.matcher.store_keys.get(key)) or bool(self.resumed)

    @cached_property
    def _world_group(self) -> tuple[int, ...]:
        return tuple(range(self.world_size))

    # -- lookups behind the mappings ----------------------------------------------------

    def _state(self, key: OpKey) -> OpState | None:
        self.check()
        return self._model.op_state(key)

    def _partner(self, st: OpState) -> Op | None:
        partner = self._model.matcher.partner(st, self._mail)
        return partner.op() if partner is not None else None


class _Timelines(Mapping[int, Timeline]):
    def __init__(self, graph: ExecutionGraph) -> None:
        self._graph = graph
        self._cache: dict[int, Timeline] = {}

    def __getitem__(self, rank: int) -> Timeline:
        found = self._cache.get(rank)
        if found is None:
            graph = self._graph
            graph.check()
            model = graph._model
            rank_model = model.rank_model(rank)
            if rank_model is None:
                raise KeyError(rank)
            found = rank_model.timeline(model.truncated(rank), graph.check)
            self._cache[rank] = found
        return found

    def __contains__(self, rank: object) -> bool:
        self._graph.check()
        return isinstance(rank, int) and self._graph._model.rank_model(rank) is not None

    def get(self, rank: int, default: Any = None) -> Any:  # type: ignore[override]
        """Mapping.get, without its exception when the timeline is built already (the
        analyses ask for each rank's many times)."""
        found = self._cache.get(rank)
        if found is not None:
            return found
        try:
            return self[rank]
        except KeyError:
            return default

    def __iter__(self) -> Iterator[int]:
        return iter(self._graph.traced)

    def __len__(self) -> int:
        return len(self._graph.traced)


class _Slots(Mapping[str, tuple[CollectiveSlot, ...]]):
    def __init__(self, graph: ExecutionGraph) -> None:
        self._graph = graph

    @cached_property
    def _gids(self) -> tuple[str, ...]:
        self._graph.check()
        return tuple(sorted(self._graph._model.matcher.slots))

    def __getitem__(self, gid: str) -> tuple[CollectiveSlot, ...]:
        graph = self._graph
        graph.check()
        group = graph._model.matcher.slots.get(gid)
        if group is None:
            raise KeyError(gid)
        found = (graph.slot_at(gid, index) for index in sorted(group))
        return tuple(slot for slot in found if slot is not None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._gids)

    def __len__(self) -> int:
        return len(self._gids)


class _Where(Mapping[OpKey, tuple[str, int]]):
    def __init__(self, graph: ExecutionGraph) -> None:
        self._graph = graph

    def __getitem__(self, key: OpKey) -> tuple[str, int]:
        st = self._graph._state(key)
        if st is None or st.pos < 0:
            raise KeyError(key)
        return (st.rec.gid, st.pos)

    def __iter__(self) -> Iterator[OpKey]:
        graph = self._graph
        for rank in graph.traced:
            model = graph._model.rank_model(rank)
            assert model is not None
            yield from ((rank, i) for i, st in model.ops.items() if st.pos >= 0)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _Partners(Mapping[OpKey, Op]):
    def __init__(self, graph: ExecutionGraph) -> None:
        self._graph = graph

    def __getitem__(self, key: OpKey) -> Op:
        graph = self._graph
        st = graph._state(key)
        partner = graph._partner(st) if st is not None and st.rec.op in ("send", "recv") else None
        if partner is None:
            raise KeyError(key)
        return partner

    def __iter__(self) -> Iterator[OpKey]:
        graph = self._graph
        for rank in graph.traced:
            model = graph._model.rank_model(rank)
            assert model is not None
            for i, st in model.ops.items():
                if st.rec.op in ("send", "recv") and graph._partner(st) is not None:
                    yield (rank, i)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def build_execution_graph(session: Session, window: int | None = None) -> ExecutionGraph:
    """Match a session's ops across ranks: the incremental model fed every trace.

    Args:
        window: fold finished history beyond this many ops (see
            :class:`dl2.model.incremental.Model`); None keeps every op.
    """
    from dl2.model.incremental import Model

    model = Model(window=window)
    for trace in session.traces.values():
        model.feed(trace.path, trace.header, trace.records, trace.truncated)
    return model.graph()
