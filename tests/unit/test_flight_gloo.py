"""dl2 on Flight Recorder dumps of real gloo jobs (torch 2.13, CPU).

The dumps in ``tests/fr_gloo/<case>/`` were made on this kind of machine by
``tests/fr_gloo/generate.py`` running ``tests/fr_gloo/cases.py`` (2 or 3 ranks); each
case asserts the verdict, the ranks and the lines of ``cases.py`` its findings name,
and its correct twin reads OK.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dl2.analysis import analyze
from dl2.flight.loader import load_flight_session
from dl2.report import FindingKind
from dl2.report import Report
from dl2.report import Verdict

FIXTURES = Path(__file__).resolve().parents[1] / "fr_gloo"
CASES_PY = "cases.py"


def _line(text: str) -> int:
    """The line of cases.py whose comment is ``# line: <text>``."""
    lines = (FIXTURES / CASES_PY).read_text().splitlines()
    return next(i for i, s in enumerate(lines, 1) if s.rstrip().endswith(f"# line: {text}"))


def _report(case: str) -> Report:
    return analyze(load_flight_session([FIXTURES / case]))


def _ops(report: Report, kind: FindingKind) -> list[tuple[int, str, int | None]]:
    [finding] = [f for f in report.findings if f.kind is kind]
    assert finding.ranks == (0, 1)
    assert all(o.file is None or o.file.endswith(CASES_PY) for o in finding.ops)
    return [(o.rank, o.op, o.line) for o in finding.ops]


@pytest.mark.parametrize(
    "case",
    [
        "cross_group_ok",
        "skipped_ok",
        "dtype_ok",
        "op_type_ok",
        "early_exit_ok",
        "size_ok",
        "subgroup_ok",
    ],
)
def test_correct_twins_are_ok(case: str) -> None:
    report = _report(case)
    assert report.verdict is Verdict.OK
    assert any("on gloo, FR records no P2P" in w for w in report.warnings)


def test_collectives_in_different_orders_on_two_groups_deadlock() -> None:
    report = _report("cross_group")
    assert report.verdict is Verdict.DEADLOCK
    assert _ops(report, FindingKind.DEADLOCK) == [
        (0, "all_reduce", _line("cross rank 0")),
        (1, "all_reduce", _line("cross rank 1")),
    ]


def test_a_skipped_collective_leaves_rank_0_waiting_on_rank_1() -> None:
    report = _report("skipped")
    assert report.verdict is Verdict.HANG
    assert _ops(report, FindingKind.HANG) == [(0, "all_reduce", _line("skipped rank 0"))]


def test_dtype_mismatch_is_a_defect() -> None:
    report = _report("dtype")
    assert report.verdict is Verdict.DEFECT
    assert sorted(_ops(report, FindingKind.COLLECTIVE_MISMATCH)) == [
        (0, "all_reduce", _line("dtype")),
        (1, "all_reduce", _line("dtype")),
    ]


def test_a_gather_of_unequal_sizes_is_a_defect() -> None:
    # gloo completes a gather whose contributions differ in size (rank 1 sends 3 of 4)
    report = _report("size")
    assert report.verdict is Verdict.DEFECT
    assert sorted(_ops(report, FindingKind.COLLECTIVE_MISMATCH)) == [
        (0, "gather", _line("size")),
        (1, "gather", _line("size")),
    ]
    assert "count" in report.findings[0].message


def test_op_type_mismatch_deadlocks_and_is_named() -> None:
    report = _report("op_type")
    assert report.verdict is Verdict.DEADLOCK
    expected = [
        (0, "all_reduce", _line("op_type rank 0")),
        (1, "broadcast", _line("op_type rank 1")),
    ]
    assert sorted(_ops(report, FindingKind.COLLECTIVE_MISMATCH)) == expected
    assert sorted(_ops(report, FindingKind.DEADLOCK)) == expected


def test_a_rank_that_exited_early_leaves_rank_0_waiting() -> None:
    report = _report("early_exit")
    assert report.verdict is Verdict.HANG
    assert _ops(report, FindingKind.HANG) == [(0, "all_reduce", _line("early_exit rank 0"))]


def test_a_subgroup_collective_one_member_skipped_deadlocks_across_groups() -> None:
    report = _report("subgroup")
    assert report.verdict is Verdict.DEADLOCK
    [finding] = [f for f in report.findings if f.kind is FindingKind.DEADLOCK]
    assert finding.ranks == (0, 1, 2) and finding.cycle == (1, 2)
    assert [(o.rank, o.group, o.line) for o in finding.ops] == [
        (1, "3", _line("subgroup rank 1")),
        (2, "0", _line("subgroup world")),
    ]
