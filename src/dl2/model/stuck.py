"""The stuck-rank core: rank statuses, the stall test, graph reduction, the wait cycle.

Everything that decides whether ranks are stuck is defined here once, as small pure
functions over a rank's status and its unmet *clauses*, so that the wait-for graph of a
trace (:mod:`dl2.model.wait_for`), the prediction's abstract machine
(:mod:`dl2.analysis.prediction.machine`) and the live tailer share one rule.

A clause is one unmet condition of a blocked rank: the ranks (``targets``) that must act
for it to hold, read as AND (``any_of`` false: every target must act) or OR (``any_of``
true: any one target suffices).  Who builds which clauses:

* the wait-for graph: AND clauses for collective members that have not posted the slot
  (or posted another op), the peer of a send or receive and group members that have not
  created the group; one OR clause over the possible senders of a wildcard receive;
* the prediction machine: one OR clause per blocked rank over every rank its op needs.
  It merges collective members, batch partners and wildcard senders into one set; read
  as OR, a rank is stuck only when none of them can ever move, which never reports a
  deadlock that an execution cannot reach (see
  :func:`dl2.analysis.prediction.blocking.stuck_ranks`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class RankStatus(StrEnum):
    """Where a rank stands.  The values are what reports and JSON show."""

    #: inside a wait or a blocking call that cannot complete yet
    BLOCKED = "blocked"
    #: polling ``is_completed()`` on pending works in a loop: waits like a blocked rank,
    #: but may leave its loop at any time, so it is never part of a deadlock set
    SPINNING = "spinning"
    #: not inside any communication that waits (or its op is matched and completing)
    RUNNING = "running"
    #: ended on its own, cleanly
    EXITED = "exited"
    #: ended with an error (or a signal its launcher cannot tell apart from one)
    FAILED = "failed"
    #: ended by a signal from outside the job (SIGKILL, SIGTERM, SIGINT, SIGHUP: the OOM
    #: killer, a scheduler, a user's kill) while the others were not
    KILLED = "killed"
    #: no trace was read for it
    NO_TRACE = "no-trace"

    @property
    def gone(self) -> bool:
        """Ended (exited, failed or killed): it will never take part in anything again."""
        return self in (RankStatus.EXITED, RankStatus.FAILED, RankStatus.KILLED)

    @property
    def can_progress(self) -> bool:
        """May still act without anything else happening first: running, spinning (it can
        leave its loop), or without a trace (nothing says it is stuck)."""
        return self in (RankStatus.RUNNING, RankStatus.SPINNING, RankStatus.NO_TRACE)


# -- the stall test ------------------------------------------------------------------------

#: Where a watchdog ``state`` record places the main thread of a rank stuck on its pending
#: works: inside backward, inside torch.distributed, or polling ``is_completed()``.
STALL_WHERE = frozenset({"backward", "comm", "poll"})


def stall_kind(where: object, pending: Collection[object] | None) -> str | None:
    """How a rank whose latest record is a watchdog ``state`` waits, or None if it does not.

    Args:
        where: the record's ``where`` (``"python"``, ``"backward"``, ``"comm"``, ``"poll"``).
        pending: the record's ``pending`` work ids.

    Returns:
        "poll" (spinning on ``is_completed()``), "stall" (waiting inside backward or
        communication) or None: no pending work, or the main thread runs Python code,
        where it may still post what its peers need.
    """
    if not pending or where not in STALL_WHERE:
        return None
    return "poll" if where == "poll" else "stall"


# -- graph reduction -----------------------------------------------------------------------


class Condition(Protocol):
    """What the reduction reads of a clause (see the module docstring);
    :class:`dl2.model.wait_for.Clause` adds the op and why it waits."""

    @property
    def targets(self) -> Sequence[int]: ...

    @property
    def any_of(self) -> bool: ...


@dataclass(frozen=True)
class Wait:
    """A clause with nothing but its targets: AND unless ``any_of``."""

    targets: tuple[int, ...]
    any_of: bool = False


def deadlock_set(waiting: Mapping[int, Sequence[Condition]], free: Iterable[int]) -> frozenset[int]:
    """Graph reduction: the waiting ranks that can never be released.

    Rule: start from the ranks that can progress (``free``); release every waiting rank
    all of whose clauses are met, and count it as able to progress; repeat until nothing
    changes.  An AND clause (``any_of`` false) is met when ALL its targets can progress
    (an AND clause without targets is met); an OR clause (``any_of`` true, a wildcard
    receive) when ANY of them can (one without targets never is).  A rank without
    clauses is released.  What is never released waits, through some clause, only on
    unreleased ranks or on ranks outside ``free`` (ended): nothing can release it.

    Work is proportional to the clauses and their targets (each target is visited once
    per clause when it is released), whatever the order.

    Args:
        waiting: rank -> its unmet clauses, for every rank that waits.
        free: the ranks that can progress; a waiting rank listed here counts as free.
    """
    released = set(free)
    # per clause: how many of its targets must still be released before it is met
    unmet: dict[int, list[int]] = {}
    open_clauses: dict[int, int] = {}  # rank -> its clauses not met yet
    watchers: dict[int, list[tuple[int, int]]] = {}  # target -> (rank, clause index)
    ready: deque[int] = deque()
    for rank, clauses in waiting.items():
        if rank in released:
            continue
        counts: list[int] = []
        for index, clause in enumerate(clauses):
            targets = list(dict.fromkeys(clause.targets))
            pending = [t for t in targets if t not in released]
            # AND: met once every target is released; OR: once one is (never if none)
            need = int(len(pending) == len(targets)) if clause.any_of else len(pending)
            counts.append(need)
            if need:
                for target in pending:
                    watchers.setdefault(target, []).append((rank, index))
        unmet[rank] = counts
        open_clauses[rank] = sum(1 for need in counts if need)
        if open_clauses[rank] == 0:
            ready.append(rank)
    while ready:
        rank = ready.popleft()
        if rank in released:
            continue
        released.add(rank)
        for watcher, index in watchers.pop(rank, ()):
            counts = unmet[watcher]
            if counts[index] == 0:
                continue
            counts[index] -= 1
            if counts[index] == 0:
                open_clauses[watcher] -= 1
                if open_clauses[watcher] == 0:
                    ready.append(watcher)
    return frozenset(r for r in waiting if r not in released)


# -- the wait cycle ------------------------------------------------------------------------


def shortest_cycle(waits: Mapping[int, Iterable[int]]) -> tuple[int, ...]:
    """The shortest cycle of a wait relation, among its own ranks.

    Args:
        waits: rank -> the ranks it waits on; targets that are not keys are ignored.

    Returns:
        The cycle as its ranks in wait order, starting at the lowest rank that lies on a
        shortest cycle; of several such cycles the one whose ranks, in order, sort first.
        A rank waiting on itself is a cycle of one; ``()`` when there is no cycle.

    Cycles lie inside strongly connected components, found in one pass; a component in
    which every rank waits on one other is a single cycle, read off in one walk (a ring
    of any size costs its length).  Other components are searched breadth-first from
    each rank, in ascending order, through higher ranks only (the lowest rank of a
    shortest cycle starts it) and no deeper than the shortest cycle found so far.
    """
    graph = {rank: sorted({t for t in targets if t in waits}) for rank, targets in waits.items()}
    best: tuple[int, ...] = ()
    for component in _cyclic_components(graph):
        found = _cycle_in(graph, component)
        if found and (not best or (len(found), found[0]) < (len(best), best[0])):
            best = found
    return best


def _cyclic_components(graph: Mapping[int, Sequence[int]]) -> list[list[int]]:
    """The strongly connected components that hold a cycle, each as its ranks ascending."""
    return [
        component
        for component in strongly_connected_components(graph)
        if len(component) > 1 or component[0] in graph[component[0]]
    ]


def strongly_connected_components(graph: Mapping[int, Sequence[int]]) -> list[list[int]]:
    """Every strongly connected component of ``graph`` (Tarjan, iteratively; every target
    must be a key), each as its ranks ascending, in reverse topological order: a
    component comes after every component it reaches.  O(nodes + edges)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    found: list[list[int]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = graph[node]
            for i in range(child, len(targets)):
                target = targets[i]
                if target not in index:
                    work.append((node, i + 1))
                    work.append((target, 0))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    found.append(sorted(component))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return found


def _cycle_in(graph: Mapping[int, Sequence[int]], component: list[int]) -> tuple[int, ...]:
    """The shortest cycle of one strongly connected component (see :func:`shortest_cycle`)."""
    members = set(component)
    succ = {rank: [t for t in graph[rank] if t in members] for rank in component}
    if all(len(targets) == 1 for targets in succ.values()):
        start = component[0]
        ring = [start]
        rank = succ[start][0]
        while rank != start:
            ring.append(rank)
            rank = succ[rank][0]
        return tuple(ring)
    best: tuple[int, ...] = ()
    for start in component:
        # breadth-first from start, targets in ascending order: the first path found to
        # each rank is the shortest one that sorts first
        paths: dict[int, tuple[int, ...]] = {start: (start,)}
        frontier = [start]
        cycle: tuple[int, ...] = ()
        while frontier and not cycle and (not best or len(paths[frontier[0]]) < len(best)):
            following = []
            for rank in frontier:
                for target in succ[rank]:
                    if target == start:
                        cycle = paths[rank]
                        break
                    if target > start and target not in paths:
                        paths[target] = (*paths[rank], target)
                        following.append(target)
                if cycle:
                    break
            frontier = following
        if cycle and (not best or len(cycle) < len(best)):
            best = cycle
    return best
