"""The live deadlock proof: two consecutive snapshots in which no member moved.

A snapshot is the session (headers and process states), the incremental model's
execution graph and the wait-for graph of one read of the traces; :class:`Snapshots`
takes one only when something was read since the last.  The model was fed as the
traces were read (:mod:`dl2.live.tailer`), so a snapshot costs what the blocked ranks
cost, whatever the length of the history: the graphs build only what is read of them,
and stay valid until the model is fed again.
A deadlock set found in two consecutive snapshots with no progress by any of its
members, the second read after the first, is a proof (:class:`DeadlockProof`): each
member waits only on members or on exited ranks, and the members' records, unchanged
between the two reads, describe them all at one instant between the reads (each op is
recorded before it is issued, so no member can have matched another's op unseen).  No
timeout is involved.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Set
from dataclasses import dataclass
from typing import Any

from dl2.model.execution_graph import ExecutionGraph
from dl2.model.incremental import Model
from dl2.model.wait_for import WaitForGraph
from dl2.model.wait_for import build_wait_for_graph
from dl2.ranks import rank_runs
from dl2.trace.format import RankTrace
from dl2.trace.session import Session
from dl2.trace.session import build_session


@dataclass(frozen=True)
class Snapshot:
    """The graphs of one read of the traces, and what they were built from.

    Attributes:
        key: what was read (the model's version, process states); equal keys, equal
            graphs.
        session: the traces' headers and process states of that read.
        graph: its execution graph.
        wfg: its wait-for graph.
    """

    key: tuple[Any, ...]
    session: Session
    graph: ExecutionGraph
    wfg: WaitForGraph


class Snapshots:
    """Builds snapshots, only when something new was read, backing off on long traces.

    After a build that took ``t`` seconds, the next one waits ``4 t``: the monitor's
    analysis stays under about a fifth of one core.
    """

    def __init__(self) -> None:
        self.last: Snapshot | None = None
        self._next_build = 0.0

    def take(
        self,
        key: tuple[Any, ...],
        now: float,
        traces: Callable[[], list[RankTrace]],
        states: Mapping[int, str],
        model: Model,
    ) -> Snapshot | None:
        """The snapshot of ``key``: the last one if its key is equal, else a new one;
        None while backing off."""
        last = self.last
        if last is not None and last.key == key:
            return last
        if now < self._next_build:
            return None
        started = time.monotonic()
        session = build_session(traces(), states)
        graph = model.graph()
        self.last = Snapshot(key, session, graph, build_wait_for_graph(session, graph))
        self._next_build = now + 4 * (time.monotonic() - started)
        return self.last

    def clear(self) -> None:
        """Forget the last snapshot (what it was built from went away)."""
        self.last = None


@dataclass(frozen=True)
class Candidate:
    """A deadlock set seen once, with its members' progress counts at that read.

    Attributes:
        deadlocked: the deadlock set.
        counts: (rank, progress count) of each member, sorted.
        req: the store's ``req`` value published after this snapshot (multi-node).
        since: when it was first seen (monotonic seconds).
    """

    deadlocked: frozenset[int]
    counts: tuple[tuple[int, int], ...]
    req: int
    since: float = 0.0


class Step(enum.Enum):
    """What one snapshot did to the proof."""

    NOTHING = "nothing"
    #: a new candidate: take the second snapshot soon
    CANDIDATE = "candidate"
    #: the snapshot repeats the candidate: the deadlock is proven
    PROVEN = "proven"


class DeadlockProof:
    """Follows the deadlock set from snapshot to snapshot until two of them prove it."""

    def __init__(self) -> None:
        self.candidate: Candidate | None = None

    def reset(self) -> None:
        """Drop the candidate (no rank is quiet and blocked, or the data went away)."""
        self.candidate = None

    def observe(
        self,
        deadlocked: frozenset[int],
        progress: Mapping[int, int],
        *,
        writing: Callable[[], Set[int]],
        fresh: Callable[[frozenset[int], int], bool],
        bump: Callable[[], int],
        now: float = 0.0,
        grace: float = 0.0,
    ) -> Step:
        """Take one snapshot's deadlock set.

        Args:
            deadlocked: the snapshot's deadlock set.
            progress: rank -> its progress count at this read.
            writing: the ranks whose trace ends in a partial record (being written).
            fresh: whether every member on another node was read after the
                candidate's snapshot (``req``).
            bump: marks the end of this snapshot for the other nodes; returns ``req``.
            now: the time of this snapshot (monotonic seconds).
            grace: how long the set must have been seen unchanged before it is proven
                (a member between two records may look blocked for that long).
        """
        if not deadlocked:
            self.candidate = None
            return Step.NOTHING
        counts = tuple(sorted((r, progress.get(r, 0)) for r in deadlocked))
        candidate = self.candidate
        if (
            candidate is not None
            and candidate.deadlocked == deadlocked
            and candidate.counts == counts
        ):
            if deadlocked & writing():
                return Step.NOTHING  # a member is writing a record: it moves, or it is stuck
            if not fresh(deadlocked, candidate.req):
                return Step.NOTHING  # another node has not re-read its files yet
            if now - candidate.since < grace:
                return Step.CANDIDATE  # a member may still be between two records
            return Step.PROVEN
        self.candidate = Candidate(deadlocked, counts, bump(), now)
        return Step.CANDIDATE


def ranks_text(ranks: Any) -> str:
    """``rank 3`` or ``ranks 0,1``: the monitor's short form of a set of ranks."""
    items = sorted(int(r) for r in ranks)
    return ("rank " if len(items) == 1 else "ranks ") + ",".join(rank_runs(items))
