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
    # Clauses with the same targets (one tuple, shared by the ranks blocked in one
    # collective) are counted once: ``need[c]`` is how many targets of shared clause
    # ``c`` must still be released before it is met, ``subscribers[c]`` the ranks that
    # have it.  Work is then linear in the distinct tuples' sizes, not in the ranks times
    # the targets (W/2 ranks blocked in one collective on W/2 others).
    shared: dict[tuple[int, bool], int] = {}
    need: list[int] = []
    subscribers: list[list[int]] = []
    kept: list[Sequence[int]] = []  # the tuples whose ids key ``shared``
    open_clauses: dict[int, int] = {}  # rank -> its clauses not met yet
    watchers: dict[int, list[int]] = {}  # target -> shared clauses it counts in
    ready: deque[int] = deque()
    for rank, clauses in waiting.items():
        if rank in released:
            continue
        opened = 0
        for clause in clauses:
            targets = clause.targets
            key = (id(targets), clause.any_of)
            index = shared.get(key)
            if index is None:
                distinct = list(dict.fromkeys(targets))
                pending = [t for t in distinct if t not in released]
                # AND: met once every target is released; OR: once one is (never if none)
                count = int(len(pending) == len(distinct)) if clause.any_of else len(pending)
                index = shared[key] = len(need)
                need.append(count)
                subscribers.append([])
                kept.append(targets)
                if count:
                    for target in pending:
                        watchers.setdefault(target, []).append(index)
            if need[index]:
                subscribers[index].append(rank)
                opened += 1
        open_clauses[rank] = opened
        if opened == 0:
            ready.append(rank)
    while ready:
        rank = ready.popleft()
        if rank in released:
            continue
        released.add(rank)
        for index in watchers.pop(rank, ()):
            if need[index] == 0:
                continue
            need[index] -= 1
            if need[index] == 0:
                for watcher in subscribers[index]:
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
    # A targets collection that several ranks share (the missing members of the
    # collective they are all blocked in) is one node of its own, numbered below 0,
    # between them and its targets: the graph then has as many edges as the ranks and the
    # distinct collections have targets, not ranks times targets.
    uses: dict[int, int] = {}
    for targets in waits.values():
        uses[id(targets)] = uses.get(id(targets), 0) + 1
    graph: dict[int, list[int]] = {}
    shared: dict[int, int] = {}
    for rank, targets in waits.items():
        if uses[id(targets)] > 1:
            node = shared.get(id(targets))
            if node is None:
                node = shared[id(targets)] = -1 - len(shared)
                graph[node] = sorted({t for t in targets if t in waits})
            graph[rank] = [node]
        else:
            graph[rank] = sorted({t for t in targets if t in waits})
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
        if component[-1] >= 0  # holds a rank (nodes below 0 stand for shared targets)
        and (len(component) > 1 or component[0] in graph[component[0]])
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
    """The shortest cycle of one strongly connected component (see :func:`shortest_cycle`;
    a node below 0 stands for the targets several ranks share, passed through)."""
    members = set(component)
    succ = {node: [t for t in graph[node] if t in members] for node in component}
    ranks = [node for node in component if node >= 0]
    if all(len(targets) == 1 for targets in succ.values()):
        start = ranks[0]
        ring = [start]
        node = succ[start][0]
        while node != start:
            if node >= 0:
                ring.append(node)
            node = succ[node][0]
        return tuple(ring)
    sets: dict[int, frozenset[int]] = {}  # a shared node's targets, as a set
    best: tuple[int, ...] = ()
    for start in ranks:
        # breadth-first from start, targets in ascending order: the first path found to
        # each rank is the shortest one that sorts first (a shared node's targets are
        # those of each rank that has it, looked at once per search)
        paths: dict[int, tuple[int, ...]] = {start: (start,)}
        passed: set[int] = set()
        frontier = [start]
        cycle: tuple[int, ...] = ()
        while frontier and not cycle and (not best or len(paths[frontier[0]]) < len(best)):
            # a cycle closed past this level would be no shorter than the best one
            last = bool(best) and len(paths[frontier[0]]) + 1 >= len(best)
            following = []
            for rank in frontier:
                for target in succ[rank]:
                    if target < 0:
                        if target in passed:
                            continue
                        passed.add(target)
                        if last:  # only whether it closes the cycle here
                            if target not in sets:
                                sets[target] = frozenset(succ[target])
                            if start in sets[target]:
                                cycle = paths[rank]
                                break
                            continue
                        through: Sequence[int] = succ[target]
                    else:
                        through = (target,)
                    for reached in through:
                        if reached == start:
                            cycle = paths[rank]
                            break
                        if reached > start and reached not in paths:
                            paths[reached] = (*paths[rank], reached)
                            following.append(reached)
                    if cycle:
                        break
                if cycle:
                    break
            frontier = following
        if cycle and (not best or len(cycle) < len(best)):
            best = cycle
    return best
