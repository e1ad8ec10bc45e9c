"""The reference the incremental model is checked against: matching from scratch.

This is dl2's matching as it was before the model became incremental (lists per group
and per channel, built from every rank's whole timeline, compared pairwise), kept as an
oracle: :mod:`model_agreement` checks that the incremental model, fed records in any
chunking, builds the same slots, matches, groups and wait-for graph.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from dl2.model.execution_graph import CollectiveSlot
from dl2.model.execution_graph import OpKey
from dl2.model.execution_graph import _exchange_sizes_agree
from dl2.model.execution_graph import op_key
from dl2.model.execution_graph import signature_fields
from dl2.model.ops import Op
from dl2.model.ops import Timeline
from dl2.model.program import WILD
from dl2.model.program import Channel
from dl2.model.program import Mailbox
from dl2.model.program import channel_of
from dl2.model.program import mailbox
from dl2.model.program import world_ranks
from dl2.model.stuck import RankStatus
from dl2.model.stuck import deadlock_set
from dl2.model.wait_for import RankNode
from dl2.model.wait_for import _bounded
from dl2.model.wait_for import _node
from dl2.model.wait_for import _settled
from dl2.trace.session import Session


def oracle_groups(timelines: Mapping[int, Timeline], world_size: int) -> dict[str, tuple[int, ...]]:
    groups: dict[str, tuple[int, ...]] = {"0": tuple(range(world_size))}
    for timeline in timelines.values():
        for op in timeline.ops:
            if op.op == "create_group" and op.ranks is not None:
                groups[op.gid] = tuple(sorted(op.ranks))
    return groups


def oracle_collectives(
    timelines: Mapping[int, Timeline], groups: Mapping[str, tuple[int, ...]]
) -> tuple[dict[str, tuple[CollectiveSlot, ...]], dict[OpKey, tuple[str, int]]]:
    per_group: dict[str, dict[int, list[Op]]] = defaultdict(dict)
    for rank, timeline in timelines.items():
        for op in timeline.ops:
            if op.kind == "collective":
                per_group[op.gid].setdefault(rank, []).append(op)
    slots: dict[str, tuple[CollectiveSlot, ...]] = {}
    where: dict[OpKey, tuple[str, int]] = {}
    for gid in sorted(per_group):
        by_rank = per_group[gid]
        members = groups.get(gid, tuple(sorted(by_rank)))
        length = max(len(ops) for ops in by_rank.values())
        group_slots: list[CollectiveSlot] = []
        for index in range(length):
            ops = {r: by_rank[r][index] for r in sorted(by_rank) if index < len(by_rank[r])}
            missing = tuple(r for r in members if r not in ops)
            fields = [signature_fields(op) for op in ops.values()]
            differing = tuple(
                sorted(
                    {
                        name
                        for f in fields
                        for name in f
                        if any(g.get(name) != f.get(name) for g in fields)
                    }
                )
            )
            if "op" in differing:
                differing = ("op",)
            elif not differing and not missing and not _exchange_sizes_agree(ops, members):
                differing = ("split_sizes",)
            group_slots.append(CollectiveSlot(gid, index, ops, missing, differing))
            for op in ops.values():
                where[op_key(op)] = (gid, index)
        slots[gid] = tuple(group_slots)
    return slots, where


def oracle_p2p(timelines: Mapping[int, Timeline]) -> dict[OpKey, Op]:
    sends: dict[Channel, list[Op]] = defaultdict(list)
    recvs: dict[Channel, list[Op]] = defaultdict(list)
    pending_any: dict[Mailbox, list[Op]] = defaultdict(list)
    for timeline in timelines.values():
        for op in timeline.ops:
            channel = channel_of(op, op.src)
            if channel is None:
                continue
            if op.op == "send":
                sends[channel].append(op)
            elif channel[1] != WILD:
                recvs[channel].append(op)
            else:
                pending_any[mailbox(channel)].append(op)
    partner: dict[OpKey, Op] = {}
    leftovers: dict[Mailbox, list[Op]] = defaultdict(list)
    for channel in sorted(set(sends) | set(recvs)):
        s_list, r_list = sends.get(channel, []), recvs.get(channel, [])
        for s, r in zip(s_list, r_list, strict=False):
            partner[op_key(s)] = r
            partner[op_key(r)] = s
        leftovers[mailbox(channel)].extend(s_list[len(r_list) :])
    for key, waiting in pending_any.items():
        available = sorted(leftovers.get(key, []), key=lambda op: (op.index, op.rank))
        for r, s in zip(waiting, available, strict=False):
            partner[op_key(s)] = r
            partner[op_key(r)] = s
    return partner


@dataclass
class OracleGraph:
    """The execution graph matched from scratch (what the wait-for graph reads of it)."""

    timelines: dict[int, Timeline]
    groups: dict[str, tuple[int, ...]]
    slots: dict[str, tuple[CollectiveSlot, ...]]
    collective_slot: dict[OpKey, tuple[str, int]]
    p2p_partner: dict[OpKey, Op]
    world_size: int
    creators: dict[tuple[str, Any], frozenset[int]] = field(default_factory=dict)

    @property
    def traced(self) -> tuple[int, ...]:
        return tuple(sorted(self.timelines))

    def slot_of(self, op: Op) -> CollectiveSlot | None:
        where = self.collective_slot.get(op_key(op))
        return self.slots[where[0]][where[1]] if where else None

    def group_members(self, gid: str) -> tuple[int, ...]:
        return self.groups.get(gid, tuple(range(self.world_size)))

    def group_creators(self, gid: str, ranks: tuple[int, ...] | None) -> frozenset[int]:
        return self.creators.get((gid, ranks), frozenset())

    def group_views(self, gid: str) -> dict[Any, frozenset[int]]:
        return {ranks: c for (name, ranks), c in self.creators.items() if name == gid and c}

    def store_key_may_exist(self, key: str) -> bool:
        return any(key in timeline.store_keys for timeline in self.timelines.values())


def oracle_graph(timelines: Mapping[int, Timeline], world_size: int) -> OracleGraph:
    """Match whole timelines from scratch."""
    timelines = dict(sorted(timelines.items()))
    groups = oracle_groups(timelines, world_size)
    slots, where = oracle_collectives(timelines, groups)
    creators: dict[tuple[str, Any], set[int]] = defaultdict(set)
    for rank, timeline in timelines.items():
        for op in timeline.ops:
            if op.op == "create_group":
                creators[(op.gid, op.ranks)].add(rank)
    return OracleGraph(
        timelines=timelines,
        groups=groups,
        slots=slots,
        collective_slot=where,
        p2p_partner=oracle_p2p(timelines),
        world_size=world_size,
        creators={k: frozenset(v) for k, v in creators.items()},
    )


def oracle_wait_for(
    session: Session, graph: OracleGraph
) -> tuple[dict[int, RankNode], frozenset[int]]:
    """Every rank's node and the deadlock set, visiting every rank of the world."""
    nodes = {
        rank: _node(session, graph, rank, _settled(session))  # type: ignore[arg-type]
        for rank in world_ranks(graph.world_size, graph.timelines)
    }
    free = (
        r
        for r, n in nodes.items()
        if n.status.can_progress
        or (
            n.status is RankStatus.BLOCKED
            and (_bounded(graph, n) or graph.timelines[r].threads > 0)  # type: ignore[arg-type]
        )
    )
    waiting = {r: n.clauses for r, n in nodes.items() if n.status is RankStatus.BLOCKED}
    return nodes, deadlock_set(waiting, free)
