"""Per-rank progress clocks of the live monitor.

A rank progresses when its trace grows by a record that is not a watchdog report
(:meth:`dl2.live.tailer.TraceTailer.progress` counts them).  The clocks keep each
rank's count at the last poll and when it last changed: the deadlock proof compares
the counts of two snapshots, the hang suspects and the hang timeout read how long
ranks have been quiet.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping


class ProgressClocks:
    """Each rank's progress count and when it last changed (``time.monotonic()``).

    Args:
        now: the start time; until some rank progresses, the job counts as having
            progressed then (for the hang timeout).

    Attributes:
        counts: rank -> progress records read at the last update.
        changed_at: rank -> when its count last changed.
        any_at: when any rank last progressed.
    """

    def __init__(self, now: float) -> None:
        self.counts: dict[int, int] = {}
        self.changed_at: dict[int, float] = {}
        self.any_at = now

    def update(self, progress: Mapping[int, int], now: float) -> set[int]:
        """Take the latest counts; returns the ranks whose count changed."""
        moved: set[int] = set()
        for rank, count in progress.items():
            if self.counts.get(rank) != count:
                self.counts[rank] = count
                self.changed_at[rank] = now
                moved.add(rank)
        if moved:
            self.any_at = now
        return moved

    def quiet(self, now: float) -> dict[int, float]:
        """rank -> seconds since its last progress."""
        return {rank: now - t for rank, t in self.changed_at.items()}

    def forget(self, ranks: Iterable[int]) -> None:
        """Drop ranks (another node's, once the link to it is gone)."""
        for rank in ranks:
            self.changed_at.pop(rank, None)
            self.counts.pop(rank, None)
