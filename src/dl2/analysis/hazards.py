"""Hazards the run did not hit: collectives of different groups issued in different orders.

gloo runs every process group on its own threads, so two ranks that issue the
collectives of groups A and B in opposite orders (``async_op=True``, waited later)
complete.  NCCL does not promise that: its kernels block until their peers arrive, and
the kernels of two communicators are not guaranteed to run concurrently; its user guide
asks applications to issue operations on different communicators in the same order on
every rank (NCCL user guide, "Using multiple NCCL communicators concurrently",
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/communicators.html:
"applications should ensure operations are submitted in the same order across ranks").

The check: every collective slot (the i-th collective of a group) is a node; each rank
adds an edge from each of its collectives to its next one, whatever the group.  Issued
in issue order, as an NCCL rank launches them, the slots can all complete exactly when
this graph has no cycle (a slot completes once every member launched it, and a member
launches it only after its earlier slots completed).  A cycle is an inversion; its
edges, merged per rank, are the two (or more) sides' orders.

Cost: one pass over the kept ops (the model's window) and one topological sort of the
slots, O(ops); slots whose members did not all issue them, and ops that raised, are
left out (other findings name them).
"""

from __future__ import annotations

from collections import defaultdict
from collections import deque
from itertools import pairwise

from dl2.analysis.describe import op_ref
from dl2.analysis.describe import where
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import op_key
from dl2.model.ops import Op
from dl2.model.wait_for import WaitForGraph
from dl2.report import Finding
from dl2.report import FindingKind

__all__ = ["order_inversion_findings"]

#: Findings reported at most (the same inversion repeated in a loop is one finding).
MAX_FINDINGS = 3
#: Cycles extracted at most while looking for distinct ones.
_MAX_ATTEMPTS = 8
#: Collectives no NCCL run issues (gloo only).
_GLOO_ONLY = frozenset({"monitored_barrier"})

_HINT = (
    "Issue the collectives of all process groups in one order on every rank (NCCL needs the "
    "same order across communicators): iterate the groups in a fixed order, not in a "
    "rank-dependent one."
)

Slot = tuple[str, int]
Edge = tuple[int, Op, Op]  # rank, its op at the source slot, its op at the target slot


def order_inversion_findings(graph: ExecutionGraph, wfg: WaitForGraph) -> list[Finding]:
    """Collectives of different groups issued in orders that deadlock on NCCL."""
    if wfg.deadlocked or not graph.timelines:
        return []
    # program order holds within a thread: a chain per thread of each rank (two threads
    # each on its own group interleave their groups in any order, and that is no hazard)
    chains: dict[tuple[int, int], list[tuple[Slot, Op]]] = {}
    issued: dict[Slot, int] = defaultdict(int)
    gids: set[str] = set()
    for rank in sorted(graph.timelines):
        for op in graph.timelines[rank].ops:
            if op.kind != "collective" or op.error is not None or op.op in _GLOO_ONLY:
                continue
            slot = graph.collective_slot.get(op_key(op))
            if slot is None:
                continue
            chains.setdefault((rank, op.tid), []).append((slot, op))
            issued[slot] += 1
            gids.add(slot[0])
    if len(gids) < 2:
        return []  # one group: positions match slots, no order can cross
    size = {gid: len(graph.group_members(gid)) for gid in gids}
    edges: dict[Slot, dict[Slot, Edge]] = defaultdict(dict)
    for (rank, _), chain in chains.items():
        kept = [(s, op) for s, op in chain if issued[s] >= size[s[0]]]
        for (a, op_a), (b, op_b) in pairwise(kept):
            if b not in edges[a]:
                edges[a][b] = (rank, op_a, op_b)
    remaining = _cyclic_part(edges)
    findings: list[Finding] = []
    seen: set[tuple[tuple[int, str, str], ...]] = set()
    for _ in range(_MAX_ATTEMPTS):
        if not remaining or len(findings) >= MAX_FINDINGS:
            break
        cycle = _a_cycle(edges, remaining)
        remaining -= {edge_from for edge_from, _ in cycle}
        # what is left must be cyclic again before the next cycle is looked for there
        remaining = _cyclic_part(edges, remaining)
        sides = _sides(cycle)
        key = tuple((r, where(a), where(b)) for r, a, b in sides)
        if key in seen:
            continue  # the same inversion again (a loop): one finding
        seen.add(key)
        findings.append(_finding(sides))
    return findings


def _cyclic_part(edges: dict[Slot, dict[Slot, Edge]], among: set[Slot] | None = None) -> set[Slot]:
    """The slots left after repeatedly removing those with no incoming edge (Kahn):
    empty exactly when the graph (restricted to ``among``) has no cycle."""
    nodes = set(edges) | {b for out in edges.values() for b in out}
    if among is not None:
        nodes &= among
    indegree = dict.fromkeys(nodes, 0)
    for a in nodes:
        for b in edges.get(a, {}):
            if b in indegree:
                indegree[b] += 1
    queue = deque(n for n, d in indegree.items() if d == 0)
    while queue:
        a = queue.popleft()
        del indegree[a]
        for b in edges.get(a, {}):
            if b in indegree:
                indegree[b] -= 1
                if indegree[b] == 0:
                    queue.append(b)
    return set(indegree)


def _a_cycle(edges: dict[Slot, dict[Slot, Edge]], remaining: set[Slot]) -> list[tuple[Slot, Edge]]:
    """One cycle inside ``remaining`` (what :func:`_cyclic_part` left: every slot there
    has a predecessor there), as (source slot, edge) pairs in order."""
    preds: dict[Slot, list[Slot]] = defaultdict(list)
    for a in sorted(remaining):
        for b in edges.get(a, {}):
            if b in remaining:
                preds[b].append(a)
    node = min(remaining)
    back: list[Slot] = []
    at: dict[Slot, int] = {}
    while node not in at:
        at[node] = len(back)
        back.append(node)
        node = preds[node][0]
    loop = list(reversed(back[at[node] :]))  # in edge order: loop[i] -> loop[i + 1]
    return [(a, edges[a][loop[(i + 1) % len(loop)]]) for i, a in enumerate(loop)]


def _sides(cycle: list[tuple[Slot, Edge]]) -> list[tuple[int, Op, Op]]:
    """The cycle's edges merged per rank: (rank, its first op, its last op) in cycle
    order, starting with the lowest rank."""
    sides: list[tuple[int, Op, Op]] = []
    for _, (rank, a, b) in cycle:
        if sides and sides[-1][0] == rank:
            sides[-1] = (rank, sides[-1][1], b)
        else:
            sides.append((rank, a, b))
    if len(sides) > 1 and sides[0][0] == sides[-1][0]:
        rank, a, _ = sides.pop()
        sides[0] = (rank, a, sides[0][2])
    first = min(range(len(sides)), key=lambda i: sides[i][0])
    return sides[first:] + sides[:first]


def _name(op: Op) -> str:
    name = op.api if op.api and op.api != op.op else op.op
    return f"{name} on group {op.gid}"


def _finding(sides: list[tuple[int, Op, Op]]) -> Finding:
    parts = [
        f"rank {rank} issues {_name(a)} ({where(a)}) before {_name(b)} ({where(b)})"
        for rank, a, b in sides
    ]
    message = (
        "Deadlocks on NCCL: collectives of different groups are issued in different orders ("
        + "; ".join(parts)
        + "). gloo runs each group on its own threads, so this run completed; on NCCL each "
        "rank can block in its first collective waiting for the others."
    )
    ops = tuple(op_ref(op) for _, a, b in sides for op in (a, b))
    return Finding(
        kind=FindingKind.POTENTIAL_DEADLOCK,
        ranks=tuple(sorted({rank for rank, _, _ in sides})),
        ops=ops,
        message=message,
        hint=_HINT,
        cycle=tuple(rank for rank, _, _ in sides),
    )
