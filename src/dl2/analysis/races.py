"""Hazards of wildcard receives: a receive from any rank that can take a message of
another size than the one it expects.

A rank that posts two receives from any sender (``recv(src=None)``) of different sizes
on one group and tag relies on the messages arriving in one order: when the other
sender's message arrives first, the first receive takes it, and gloo aborts on the
size ("Received data size doesn't match"), NCCL and MPI truncate or corrupt.  The run
itself completed: :func:`wildcard_size_findings` names the receive, the send it can
take and the order that breaks it.

A send cannot race a receive when its rank issued it only after learning that the
receive had completed: the check skips a send that the receive's completion happened
before, through any chain of the run's messages and collectives (a reply, a reply
forwarded through a third rank, a collective).

Cost: per rank and (group, tag), the pairs of its wildcard receives, at most
:data:`MAX_PAIRS` each; at most :data:`MAX_CHECKS` candidates per rank, each reading at
most :data:`MAX_VISITS` ops of the timelines (the model's window) for causality.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Sequence
from itertools import combinations

from dl2.analysis.describe import op_ref
from dl2.analysis.describe import phrase
from dl2.analysis.describe import where
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import op_key
from dl2.model.ops import Op
from dl2.model.program import wait_position
from dl2.report import Finding
from dl2.report import FindingKind

__all__ = ["wildcard_size_findings"]

#: pairs of wildcard receives looked at per rank and channel
MAX_PAIRS = 256
#: candidate sends checked for causality per rank
MAX_CHECKS = 32
#: ops read by one causality check, at most
MAX_VISITS = 200_000


def wildcard_size_findings(graph: ExecutionGraph) -> list[Finding]:
    """Wildcard receives that another arrival order would pair with a send of another
    size (one finding per rank)."""
    findings: list[Finding] = []
    for rank in sorted(graph.timelines):
        channels: dict[tuple[str, int], list[Op]] = defaultdict(list)
        for op in graph.p2p_ops(rank):
            if op.op == "recv" and op.peer is None and op.src is not None and op.error is None:
                channels[(op.gid, op.tag or 0)].append(op)
        found = None
        checks = 0
        for ops in channels.values():
            for pairs, (first, later) in enumerate(combinations(ops, 2)):
                if pairs >= MAX_PAIRS or found is not None or checks >= MAX_CHECKS:
                    break
                if first.src == later.src or _size(first) == _size(later):
                    continue
                send = graph.p2p_partner.get(op_key(later))
                if send is None or _size(send) == _size(first):
                    continue
                checks += 1
                if not _after(graph, send, first):
                    found = (first, send)
        if found is not None:
            findings.append(_finding(*found))
    return findings


def _size(op: Op) -> tuple[str | None, int | None]:
    return op.dtype, op.count


def _after(graph: ExecutionGraph, send: Op, recv: Op) -> bool:
    """Whether ``send``'s rank issued it only after ``recv`` completed, through any chain
    of the run's own messages and collectives (rank 0 receives, then tells rank 1, which
    tells rank 2, which sends): what happened before a message or a collective's
    completion happened before everything its receivers did after it.

    Each rank is read from the first of its ops known to come after ``recv`` (found by
    bisection), and each collective slot releases its members once; at most
    :data:`MAX_VISITS` ops are read or released, past which only the send's own rank's
    direct links count (:func:`_one_hop_after`).
    """
    if graph.timelines.get(send.rank) is None:
        return False
    start = wait_position(recv)
    if start is None:
        return False
    reach: dict[int, int] = {recv.rank: start}  # rank -> its first op after recv completed
    scanned: dict[int, int] = {}  # rank -> the first op index already read from
    released_slots: set[tuple[str, int]] = set()  # a slot releases its members once
    queue = [recv.rank]
    visits = 0
    while queue:
        rank = queue.pop()
        timeline = graph.timelines.get(rank)
        begin, end = reach[rank], scanned.get(rank)
        if timeline is None or (end is not None and begin >= end):
            continue
        scanned[rank] = begin
        ops = timeline.ops
        for i in range(bisect_left(ops, begin, key=_index), len(ops)):
            op = ops[i]
            if end is not None and op.index >= end:
                break
            visits += 1
            if op.error is not None:
                continue
            released: Sequence[Op] = ()
            if op.op == "send":
                partner = graph.p2p_partner.get(op_key(op))
                released = (partner,) if partner is not None else ()
            elif op.kind == "collective":
                where = graph.collective_slot.get(op_key(op))
                if where is not None and where not in released_slots:
                    released_slots.add(where)
                    slot = graph.slot_at(*where)
                    released = tuple(slot.ops.values()) if slot is not None else ()
            visits += len(released)
            if visits > MAX_VISITS:
                return _one_hop_after(graph, send, recv)
            for other in released:
                at = wait_position(other)
                if at is not None and at < reach.get(other.rank, at + 1):
                    reach[other.rank] = at
                    queue.append(other.rank)
    return send.index >= reach.get(send.rank, send.index + 1)


def _index(op: Op) -> int:
    return op.index


def _one_hop_after(graph: ExecutionGraph, send: Op, recv: Op) -> bool:
    """Whether ``send``'s rank issued it only after an op of ``recv``'s rank that comes
    after ``recv`` (so ``recv`` had completed): a P2P partner or a collective slot."""
    timeline = graph.timelines.get(send.rank)
    if timeline is None:
        return False
    later_ops = {op_key(op): op for op in graph.timelines[recv.rank].ops if op.index > recv.index}
    for op in timeline.ops:
        if op.index >= send.index:
            break
        partner = graph.p2p_partner.get(op_key(op))
        if partner is not None and op_key(partner) in later_ops:
            return True
        slot = graph.slot_of(op) if op.kind == "collective" else None
        if slot is not None and any(
            op_key(other) in later_ops for other in slot.ops.values() if other.rank == recv.rank
        ):
            return True
    return False


def _finding(recv: Op, send: Op) -> Finding:
    return Finding(
        kind=FindingKind.POTENTIAL_MISMATCH,
        ranks=tuple(sorted({recv.rank, send.rank})),
        ops=(op_ref(recv), op_ref(send)),
        message=(
            f"Rank {recv.rank}'s {phrase(recv)} ({where(recv)}, {recv.signature}) can take "
            f"rank {send.rank}'s {phrase(send)} ({where(send)}, {send.signature}) when that "
            f"message arrives first; in this run rank {recv.src}'s came first. gloo then "
            "aborts on the size (NCCL and MPI truncate or corrupt the data)."
        ),
        hint=(
            "Do not let receives from any rank of different sizes race: receive from named "
            "sources, give each kind of message its own tag, or make every message the "
            "same size (send the size first)."
        ),
        group=recv.gid,
    )
