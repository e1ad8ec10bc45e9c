"""Where the machine's blocked ranks wait, and which of them are deadlocked.

For each rank blocked in a settled :class:`~dl2.analysis.prediction.machine.State`:
the op it waits on, in what state that op is (unmatched, incomplete, not launched,
queued, its batch unfinished) and on which ranks; then graph reduction
(:func:`dl2.model.stuck.deadlock_set`) tells which of them nothing can release.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dl2.analysis.prediction.program import COLL
from dl2.analysis.prediction.program import RECV
from dl2.analysis.prediction.program import SEND
from dl2.model.program import WILD
from dl2.model.stuck import Wait
from dl2.model.stuck import deadlock_set

if TYPE_CHECKING:
    from dl2.analysis.prediction.machine import State

__all__ = ["Stuck", "stuck_ranks"]


@dataclass(frozen=True)
class Stuck:
    """A rank of a deadlock: the op it waits on, why that op cannot complete, on whom.

    ``state`` is one of "unmatched" (a send or receive nobody can match), "incomplete" (a
    collective some members never join), "not-launched" (an atomic batch that cannot
    start: some op of it has no posted partner), "queued" (behind an earlier op that
    cannot complete, works completing in issue order), "batch" (its own part is done but
    the rest of its batch is not).
    """

    rank: int
    op: int
    state: str
    waits_on: tuple[int, ...]
    note: str = ""
    queued: int = 0  # later ops of the rank that wait behind it (issue-order completion)


def _peers(state: State, u: int) -> set[int]:
    """The ranks whose posting or progress the op needs."""
    p = state.p
    op = p.ops[u]
    kind = p.kind[u]
    if kind == COLL:
        sid = p.slot[u]
        waiting = {p.ops[v].rank for v in p.slot_ops[sid] if not state.active[v]}
        return (waiting | set(p.slot_missing[sid])) - {op.rank}
    if kind in (SEND, RECV):
        channel = p.channel[u]
        assert channel is not None
        other = channel[2] if kind == SEND else channel[1]
        if other == WILD:
            return set(p.members.get(op.gid, p.world)) - {op.rank}
        return {other}
    return set()


def _waits(state: State, u: int) -> tuple[set[int], str]:
    """The ranks an op waits on, and its state (see :class:`Stuck`)."""
    p = state.p
    unit = state.m.unit_of[u]
    if not state.active[u]:
        if unit in state.pending:
            needs = [v for v in state.m.units[unit] if not state.launchable(v)]
            return set().union(*(_peers(state, v) for v in needs)), "not-launched"
        queue = state.stream.get(p.ops[u].rank)
        if queue and queue[0] != unit:
            head = state.m.members_of(queue[0])
            found: set[int] = set()
            for v in head:
                if not state.ok[v]:
                    found |= _waits(state, v)[0]
            return found, "queued"
        return set(), "not-launched"
    if not state.ok[u]:
        return _peers(state, u), "incomplete" if p.kind[u] == COLL else "unmatched"
    others: set[int] = set()
    for v in state.m.members_of(unit):
        if not state.ok[v]:
            others |= _waits(state, v)[0]
    return others, "batch"


def stuck_ranks(state: State, options: list[tuple[int, int]]) -> tuple[Stuck, ...]:
    """The blocked ranks that nothing can release, by graph reduction
    (:func:`dl2.model.stuck.deadlock_set`).

    Ranks that may still act release those waiting on them: ranks not blocked whose
    trace does not end cleanly (running, crashed or without a trace: they may do
    what the recording does not show) and ranks with an open choice.  A blocked
    rank's wait is one OR clause over every rank its op needs (:func:`_waits` merges
    collective members, batch partners and wildcard senders into one set), so it is
    stuck only when each of them is stuck or has ended.  Read as AND, that merged
    set would also hold a wildcard receive whose other sender can still send: a
    prediction must never report a deadlock that no execution reaches.
    """
    if not state.blocked:
        return ()
    free = {r for r in state.p.world if r not in state.blocked and r not in state.p.closed}
    free.update(state.p.ops[w].rank for w, _ in options)
    waits = {rank: _waits(state, u) for rank, u in state.blocked.items()}
    dead = deadlock_set(
        {
            rank: (Wait(tuple(sorted(targets)), any_of=True),)
            for rank, (targets, _) in waits.items()
        },
        free,
    )
    return tuple(
        Stuck(
            rank,
            state.blocked[rank],
            waits[rank][1],
            tuple(sorted(waits[rank][0])),
            _note(state, state.blocked[rank], waits[rank][1]),
            max(0, len(state.stream.get(rank, ())) - 1),
        )
        for rank in sorted(dead)
    )


def _note(state: State, u: int, how: str) -> str:
    """A sentence on why a batch cannot start or finish."""
    unit = state.m.unit_of[u]
    if unit not in state.m.units:
        return ""
    members = state.m.units[unit]
    if how == "not-launched":
        ready = sum(1 for v in members if state.launchable(v))
        return (
            f"only {ready} of the {len(members)} ops of its batch have a partner posted, "
            "and the batch launches as one unit"
        )
    if how == "batch":
        done = sum(1 for v in members if state.ok[v])
        return f"{len(members) - done} of the {len(members)} ops of its batch cannot complete"
    return ""
