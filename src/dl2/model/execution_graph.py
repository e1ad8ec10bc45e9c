"""The execution graph: every rank's ops in program order plus the cross-rank matches.

Collectives are matched per process group by position: the i-th collective a member
issues on a group meets the i-th of every other member.  P2P ops are matched per
channel (:func:`dl2.model.program.channel_of`: group, sender, receiver, tag) in order
(gloo and MPI do not let messages overtake); a wildcard receive meets the sender
recorded when it completed, or the earliest unmatched send to it while it is still
pending.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from dl2.model.ops import NO_DATA_OPS
from dl2.model.ops import SAME_COUNT_OPS
from dl2.model.ops import Op
from dl2.model.ops import Timeline
from dl2.model.ops import build_timeline
from dl2.model.program import WILD
from dl2.model.program import Channel
from dl2.model.program import Mailbox
from dl2.model.program import channel_of
from dl2.model.program import mailbox
from dl2.trace.session import Session

OpKey = tuple[int, int]  # (rank, op id)


def op_key(op: Op) -> OpKey:
    return (op.rank, op.id)


def signature_fields(op: Op) -> dict[str, object]:
    """The fields that must agree between members for a collective to match."""
    fields: dict[str, object] = {"op": op.op}
    if op.root is not None or op.op in ("broadcast", "reduce", "gather", "scatter"):
        fields["root"] = op.root
    if op.redop is not None:
        fields["redop"] = op.redop
    if op.op not in NO_DATA_OPS:
        fields["dtype"] = op.dtype
    if op.op in SAME_COUNT_OPS:
        fields["count"] = op.count
    if op.op == "all_reduce_coalesced" and op.splits is not None:
        fields["splits"] = op.splits  # the same tensors must be fused on every rank
    return fields


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


@dataclass(frozen=True)
class ExecutionGraph:
    """Ops of all ranks with their cross-rank matches.

    Attributes:
        timelines: rank -> its ops in program order and its final blocking state.
        groups: group name -> global ranks of its members.
        slots: group name -> its collective slots in order.
        collective_slot: (rank, op id) -> (group, index) of a collective.
        p2p_partner: (rank, op id) -> the matching op on the peer.
        world_size: ranks of the job.
    """

    timelines: Mapping[int, Timeline]
    groups: Mapping[str, tuple[int, ...]]
    slots: Mapping[str, tuple[CollectiveSlot, ...]]
    collective_slot: Mapping[OpKey, tuple[str, int]]
    p2p_partner: Mapping[OpKey, Op]
    world_size: int

    def slot_of(self, op: Op) -> CollectiveSlot | None:
        where = self.collective_slot.get(op_key(op))
        return self.slots[where[0]][where[1]] if where else None

    def group_members(self, gid: str) -> tuple[int, ...]:
        """The members of a group; a group no trace created is taken as the world."""
        members = self.groups.get(gid)
        return members if members is not None else self._world_group

    def group_creators(self, gid: str, ranks: tuple[int, ...] | None) -> frozenset[int]:
        """The ranks whose trace creates the group ``gid`` of these ``ranks``."""
        return self._creators.get((gid, ranks), frozenset())

    @cached_property
    def _world_group(self) -> tuple[int, ...]:
        return tuple(range(self.world_size))

    @cached_property
    def _creators(self) -> dict[tuple[str, tuple[int, ...] | None], frozenset[int]]:
        found: dict[tuple[str, tuple[int, ...] | None], set[int]] = defaultdict(set)
        for rank, timeline in self.timelines.items():
            for op in timeline.ops:
                if op.op == "create_group":
                    found[(op.gid, op.ranks)].add(rank)
        return {key: frozenset(ranks) for key, ranks in found.items()}


def _groups(timelines: Mapping[int, Timeline], world_size: int) -> dict[str, tuple[int, ...]]:
    groups: dict[str, tuple[int, ...]] = {"0": tuple(range(world_size))}
    for timeline in timelines.values():
        for op in timeline.ops:
            if op.op == "create_group" and op.ranks is not None:
                groups[op.gid] = tuple(sorted(op.ranks))
    return groups


_EXCHANGE_OPS = frozenset({"all_to_all", "all_to_all_single"})


def _exchange_sizes_agree(ops: Mapping[int, Op], members: tuple[int, ...]) -> bool:
    """Whether an all_to_all's split sizes pair up: what member i sends to member j
    (its input split j) is what j expects from i (its output split i)."""
    first = next(iter(ops.values()))
    if first.op not in _EXCHANGE_OPS:
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


def _match_collectives(
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
                differing = ("op",)  # other fields of different ops are not comparable
            elif not differing and not missing and not _exchange_sizes_agree(ops, members):
                differing = ("split_sizes",)
            group_slots.append(CollectiveSlot(gid, index, ops, missing, differing))
            for op in ops.values():
                where[op_key(op)] = (gid, index)
        slots[gid] = tuple(group_slots)
    return slots, where


def _match_p2p(timelines: Mapping[int, Timeline]) -> dict[OpKey, Op]:
    """Pair sends with receives; see the module docstring for the rules."""
    sends: dict[Channel, list[Op]] = defaultdict(list)
    recvs: dict[Channel, list[Op]] = defaultdict(list)
    pending_any: dict[Mailbox, list[Op]] = defaultdict(list)
    for timeline in timelines.values():
        for op in timeline.ops:
            # a completed wildcard receive is matched as a receive from its recorded sender
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


def build_execution_graph(session: Session) -> ExecutionGraph:
    """Rebuild ops from a session's traces and match them across ranks."""
    timelines = {rank: build_timeline(trace) for rank, trace in session.traces.items()}
    world_size = session.world_size
    groups = _groups(timelines, world_size)
    slots, where = _match_collectives(timelines, groups)
    return ExecutionGraph(
        timelines=timelines,
        groups=groups,
        slots=slots,
        collective_slot=where,
        p2p_partner=_match_p2p(timelines),
        world_size=world_size,
    )
