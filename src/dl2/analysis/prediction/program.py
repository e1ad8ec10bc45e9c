"""The recorded programs, indexed once per execution graph for the abstract machine.

Every rank's ops are numbered ``u`` 0..n-1 and sorted out by what the machine does with
them: collectives by slot, sends and receives by channel and position in it
(:func:`dl2.model.program.channel_of`), batches, and each rank's program as steps,
posting its ops in recorded order and waiting where :func:`dl2.model.program.
wait_position` says it blocks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from dl2.model.dtypes import op_bytes
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.ops import Op
from dl2.model.program import WILD
from dl2.model.program import Channel
from dl2.model.program import channel_of
from dl2.model.program import wait_position
from dl2.model.program import world_ranks

__all__ = ["COLL", "NOOP", "RECV", "SEND", "Program", "build_program"]

NOOP, COLL, SEND, RECV = range(4)

#: How far after a wildcard receive to look for the op that uses its source.
_PIN_LOOKAHEAD = 16


@dataclass(frozen=True)
class Program:
    """Every rank's recorded ops, flattened and indexed once per execution graph.

    Ops are numbered ``u`` 0..n-1 in rank order, then program order.

    Attributes:
        ops: u -> the recorded op.
        kind: u -> NOOP, COLL, SEND or RECV (ops that raised, new_group, and collectives
            without a slot are NOOPs: they complete as soon as they start).
        nbytes: u -> bytes a send carries (count × itemsize), None if unknown.
        channel: u -> (group, sender, receiver, tag) of a send or receive.
        position: u -> index of a send among the sends of its channel, of a receive among
            the receives of its channel (wildcards: among the wildcards of the receiver).
        slot: u -> collective slot id, or -1.
        slot_ops: slot id -> its ops; ``slot_need``: how many must be active for it to
            complete (-1: never, a member with a trace never issued it).
        slot_missing: slot id -> members that never issued it.
        batches: the batches, each a tuple of the ops of one rank sharing a batch id.
        pinned: wildcard receives whose returned sender a later op of their rank took
            its peer from (``Op.via``: ``src = recv(); send(dst=src)``, ``recv(src=3 -
            first)``), or, in older traces that do not mark such ops (no
            ``Header.follows``), whose rank's next send or receive names the sender
            recorded for it: the program follows the matched source,
            so another match would change what the rank does next, which the recording
            cannot tell.  Every wildcard issued at the call site (rank and stack) of
            one the program followed is pinned too, and one whose rank next receives
            from the recorded sender on the same group (a header, then its payload: the
            sender may come from the data).  They keep their recorded sender.
        steps: rank -> its program: (is_wait, u) in order.
        closed: ranks whose trace ends with a clean ``end`` record (they will do nothing
            more); every other rank (still running, crashed, or without a trace) might.
        members: group -> member ranks.
        world: all ranks of the job.
    """

    ops: tuple[Op, ...]
    kind: tuple[int, ...]
    nbytes: tuple[int | None, ...]
    channel: tuple[Channel | None, ...]
    position: tuple[int, ...]
    slot: tuple[int, ...]
    slot_ops: tuple[tuple[int, ...], ...]
    slot_need: tuple[int, ...]
    slot_missing: tuple[tuple[int, ...], ...]
    batches: tuple[tuple[int, ...], ...]
    pinned: Mapping[int, int]
    steps: Mapping[int, tuple[tuple[bool, int], ...]]
    closed: frozenset[int]
    members: Mapping[str, tuple[int, ...]]
    world: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.ops)

    def send_sizes(self) -> tuple[int, ...]:
        """The distinct known byte sizes of sends, ascending."""
        return tuple(
            sorted({b for u, b in enumerate(self.nbytes) if self.kind[u] == SEND and b is not None})
        )

    def wildcards(self) -> tuple[int, ...]:
        """The wildcard receives."""
        return tuple(
            u
            for u, ch in enumerate(self.channel)
            if ch is not None and self.kind[u] == RECV and ch[1] == WILD
        )


#: the default group's name: a wildcard on it hands its sender to the program as is
_DEFAULT_GROUP = "0"


def build_program(graph: ExecutionGraph) -> Program:
    """Index a graph's ops for the machine (see :class:`Program`)."""
    ops: list[Op] = []
    first: dict[int, int] = {}
    for rank in sorted(graph.timelines):
        first[rank] = len(ops)
        ops.extend(graph.timelines[rank].ops)
    n = len(ops)
    kind = [NOOP] * n
    nbytes: list[int | None] = [None] * n
    channel: list[Channel | None] = [None] * n
    position = [0] * n
    slot = [-1] * n
    counts: dict[tuple[object, ...], int] = defaultdict(int)
    slot_ids: dict[tuple[str, int], int] = {}
    slot_ops: list[list[int]] = []
    for u, op in enumerate(ops):
        if op.error is not None:
            continue
        ch = channel_of(op)
        if ch is not None:
            kind[u] = SEND if op.op == "send" else RECV
            channel[u] = ch
            if kind[u] == SEND:
                nbytes[u] = op_bytes(op.dtype, op.count)
            position[u] = counts[(kind[u], *ch)]
            counts[(kind[u], *ch)] += 1
        elif op.kind == "collective":
            where = graph.collective_slot.get((op.rank, op.id))
            if where is None:
                continue
            if where not in slot_ids:
                slot_ids[where] = len(slot_ops)
                slot_ops.append([])
            kind[u] = COLL
            slot[u] = slot_ids[where]
            slot_ops[slot[u]].append(u)
    slot_need: list[int] = []
    slot_missing: list[tuple[int, ...]] = []
    for (gid, index), sid in sorted(slot_ids.items(), key=lambda item: item[1]):
        # slot_at, not slots[gid][index]: that builds the group's every slot (O(slots²))
        found = graph.slot_at(gid, index)
        missing = found.missing if found is not None else ()
        slot_missing.append(tuple(missing))
        never = any(r in graph.timelines for r in missing)
        slot_need.append(-1 if never else len(slot_ops[sid]))

    batches: dict[tuple[int, int], list[int]] = defaultdict(list)
    for u, op in enumerate(ops):
        if op.batch is not None:
            batches[(op.rank, op.batch)].append(u)

    pinned: dict[int, int] = {}
    # (rank, op id) of the wildcards whose returned sender a later op's peer came from
    followed = {(op.rank, op.via) for op in ops if op.via is not None}
    # (u, the recorded sender) of the wildcard receives that matched one
    wildcards = [
        (u, op.src)
        for u, op in enumerate(ops)
        if kind[u] == RECV and op.peer is None and op.src is not None
    ]
    for u, src in wildcards:
        op = ops[u]
        if (op.rank, op.id) in followed:
            pinned[u] = src
            continue
        j = u - first[op.rank] + 1  # the op's place in its timeline, plus one
        later = graph.timelines[op.rank].ops[j : j + _PIN_LOOKAHEAD]
        following = next((o for o in later if o.kind == "p2p" and o.error is None), None)
        if following is None or following.peer != src:
            continue
        continues = following.op == "recv" and following.gid == op.gid
        marked = op.gid == _DEFAULT_GROUP or graph.follows_group_peers
        if graph.follows_peers and marked and not continues:
            # no later peer came from its sender: the program names its own (on a
            # subgroup, older recorders lost the mark in torch's translation to a global
            # rank).
            # A receive from that sender next is read as the rest of its message (a
            # header that names its sender, then the payload): the program may have
            # read the sender from the data, which no mark follows
            continue
        pinned[u] = src
    # Where the program followed the sender once, the call site (rank, stack) is pinned
    # whole: what the rank does after a receive there depends on what it received (a
    # server replies to an update and only counts a "done"), so the recorded
    # continuation of any receive there says nothing of what another match leads to.
    following_sites = {(ops[u].rank, ops[u].stack) for u in pinned if ops[u].stack}
    for u, src in wildcards:
        if u not in pinned and (ops[u].rank, ops[u].stack) in following_sites:
            pinned[u] = src

    steps: dict[int, tuple[tuple[bool, int], ...]] = {}
    for rank, timeline in graph.timelines.items():
        base = first[rank]
        # (wait position, u) in order; an op's u is its place in ``ops``, not base plus
        # its index: a damaged trace (an op id written twice) can leave gaps in indices
        waits = sorted(
            (at, base + j)
            for j, op in enumerate(timeline.ops)
            if (at := wait_position(op)) is not None
        )
        program: list[tuple[bool, int]] = []
        k = 0
        for j, op in enumerate(timeline.ops):
            while k < len(waits) and waits[k][0] <= op.index:
                program.append((True, waits[k][1]))
                k += 1
            program.append((False, base + j))
        program.extend((True, u) for _, u in waits[k:])
        steps[rank] = tuple(program)

    groups = dict(graph.groups)
    for op in ops:
        if op.gid not in groups:
            groups[op.gid] = graph.group_members(op.gid)
    world = tuple(world_ranks(graph.world_size, graph.timelines))
    return Program(
        ops=tuple(ops),
        kind=tuple(kind),
        nbytes=tuple(nbytes),
        channel=tuple(channel),
        position=tuple(position),
        slot=tuple(slot),
        slot_ops=tuple(tuple(s) for s in slot_ops),
        slot_need=tuple(slot_need),
        slot_missing=tuple(slot_missing),
        batches=tuple(tuple(b) for _, b in sorted(batches.items())),
        pinned=pinned,
        steps=steps,
        closed=frozenset(r for r, t in graph.timelines.items() if t.ended is not None),
        members=groups,
        world=world,
    )
