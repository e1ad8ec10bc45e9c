"""Small factories for test data: every argument has a default, so a test names only
what it is about.

Report objects (:mod:`dl2.report`): :func:`op_ref`, :func:`finding`,
:func:`rank_state`, :func:`report`.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping

from dl2.model.stuck import RankStatus
from dl2.report import Finding
from dl2.report import FindingKind
from dl2.report import OpRef
from dl2.report import RankState
from dl2.report import Report
from dl2.report import Verdict

# -- report objects ----------------------------------------------------------------------


def op_ref(
    rank: int = 0,
    op: str = "all_reduce",
    *,
    group: str = "0",
    seq: int | None = None,
    peer: int | None = None,
    api: str | None = None,
    detail: str = "",
    file: str | None = "train.py",
    line: int | None = 42,
    function: str | None = None,
) -> OpRef:
    """An operation of one rank; by default an all_reduce at train.py:42."""
    return OpRef(
        rank=rank,
        op=op,
        group=group,
        seq=seq,
        peer=peer,
        api=api,
        detail=detail,
        file=file,
        line=line,
        function=function,
    )


def finding(
    kind: FindingKind | str = FindingKind.DEADLOCK,
    *ops: OpRef,
    ranks: Iterable[int] | None = None,
    message: str = "",
    hint: str = "",
    cycle: Iterable[int] = (),
    group: str | None = None,
) -> Finding:
    """A finding over ``ops``; ``ranks`` defaults to the ops' ranks, sorted."""
    if ranks is None:
        ranks = {op.rank for op in ops}
    return Finding(
        kind=FindingKind(kind),
        ranks=tuple(sorted(ranks)),
        ops=ops,
        message=message or f"a {FindingKind(kind).value} finding",
        hint=hint,
        cycle=tuple(cycle),
        group=group,
    )


def rank_state(
    rank: int = 0,
    status: str = "blocked",
    op: OpRef | None = None,
    waits_on: Iterable[int] = (),
    *,
    any_of: bool = False,
) -> RankState:
    """Where one rank stands at the end of a trace; by default blocked in nothing."""
    return RankState(
        rank=rank, status=RankStatus(status), op=op, waits_on=tuple(waits_on), any_of=any_of
    )


_HANGS = (FindingKind.DEADLOCK, FindingKind.ORPHANED_WAIT)


def report(
    *findings: Finding,
    ranks: Iterable[RankState] = (),
    verdict: Verdict | str | None = None,
    world_size: int | None = None,
    warnings: Iterable[str] = (),
    job: Mapping[str, object] | None = None,
) -> Report:
    """A report of ``findings``.

    ``verdict`` defaults to deadlock if a finding is a deadlock or an orphaned wait,
    defect if there is any other finding, else ok; ``world_size`` to one more than the
    highest rank in ``ranks``.
    """
    states = tuple(ranks)
    if verdict is None:
        if any(f.kind in _HANGS for f in findings):
            verdict = Verdict.DEADLOCK
        else:
            verdict = Verdict.DEFECT if findings else Verdict.OK
    if world_size is None:
        world_size = max((s.rank for s in states), default=-1) + 1
    return Report(
        verdict=Verdict(verdict),
        findings=findings,
        ranks=states,
        world_size=world_size,
        warnings=tuple(warnings),
        job=dict(job or {}),
    )
