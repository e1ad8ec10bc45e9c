"""Sets of ranks as people read them: runs of consecutive ranks folded (``0-3, 5, 7``).

A job of thousands of ranks names thousands of ranks in a finding; listed one by one
they bury the report.  Every place that prints a set of ranks folds them here.
"""

from __future__ import annotations

from collections.abc import Iterable


def rank_runs(ranks: Iterable[int], shortest: int = 3) -> list[str]:
    """The sorted distinct ranks, each run of at least ``shortest`` consecutive ranks
    as ``first-last``, the others one by one."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        if end - start + 1 >= shortest:
            parts.append(f"{ordered[start]}-{ordered[end]}")
        else:
            parts.extend(str(r) for r in ordered[start : end + 1])
        start = end + 1
    return parts


def ranks_phrase(ranks: Iterable[int]) -> str:
    """``rank 3`` / ``ranks 0 and 1`` / ``ranks 0, 1 and 2`` / ``ranks 2-8191`` /
    ``ranks 0-3, 5 and 7``: prose, runs of four or more folded."""
    items = sorted(set(ranks))
    parts = rank_runs(items, shortest=4)
    if len(items) == 1:
        return f"rank {items[0]}"
    if len(parts) == 1:
        return f"ranks {parts[0]}"
    return "ranks " + ", ".join(parts[:-1]) + " and " + parts[-1]
