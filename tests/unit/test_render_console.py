"""The console report: verdicts, cycle lines, the rank table, findings and caps."""

from __future__ import annotations

import pytest

from builders import finding
from builders import op_ref
from builders import rank_state
from builders import report
from dl2.render.console import ConsoleRenderer
from dl2.render.console import cycle_line
from dl2.render.console import headline
from dl2.render.console import op_label
from dl2.render.console import rank_list
from dl2.report import Finding
from dl2.report import FindingKind
from dl2.report import OpRef
from dl2.report import Report
from dl2.report import Verdict
from sample_reports import collective_mismatch
from sample_reports import large
from sample_reports import orphaned_wait
from sample_reports import sendsend_deadlock
from sample_reports import three_rank_cycle
from sample_reports import wildcard_wait


def render(rep: Report, **options: object) -> str:
    return ConsoleRenderer(**options).render(rep)  # type: ignore[arg-type]


def lines_of(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


# -- verdicts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rep", "first_words"),
    [
        (report(ranks=[rank_state(0, "exited")]), "OK: no communication defect found in 1 rank"),
        (sendsend_deadlock(), "DEADLOCK: 2 ranks wait on each other forever"),
        (collective_mismatch(), "DEFECT: 1 communication defect, no deadlock"),
        (report(verdict=Verdict.JOB_FAILED), "JOB FAILED:"),
    ],
    ids=["ok", "deadlock", "defect", "job-failed"],
)
def test_every_verdict_has_a_headline_first(rep: Report, first_words: str) -> None:
    # GIVEN a report of each verdict WHEN rendered
    text = render(rep)
    # THEN the verdict is the first text line, inside its panel
    assert text.splitlines()[1].strip("│ ").startswith(first_words)


def test_headline_variants() -> None:
    assert headline(report()) == "OK: no communication defect found (no ranks traced)"
    assert headline(orphaned_wait()) == "DEADLOCK: rank 0 waits forever on a rank that exited"
    assert headline(three_rank_cycle()) == "DEADLOCK: 3 ranks wait on each other forever"
    self_wait = finding(FindingKind.DEADLOCK, op_ref(0, "recv", peer=0), cycle=[0])
    assert headline(report(self_wait)) == "DEADLOCK: rank 0 waits on itself forever"
    assert headline(report(verdict=Verdict.DEFECT)).startswith("DEFECT:")


def _gone_rank_findings(waiting: OpRef, gone: int) -> tuple[Finding, Finding]:
    """An orphaned wait of ``waiting`` on rank ``gone``, and ``gone`` missing its op."""
    ranks = sorted({waiting.rank, gone})
    return (
        finding(FindingKind.ORPHANED_WAIT, waiting, ranks=ranks, group=waiting.group),
        finding(FindingKind.COLLECTIVE_MISSING, waiting, ranks=ranks, group=waiting.group),
    )


def test_findings_a_collective_mismatch_brings_about_are_not_counted_as_defects() -> None:
    # GIVEN a mismatch at all_reduce #1 of group 0, then (gloo aborted rank 1) rank 0
    # waiting on rank 1 at #2 and rank 1 missing #2; and an unrelated one on group 3
    at_one = [op_ref(r, seq=1) for r in (0, 1)]
    mismatch = finding(FindingKind.COLLECTIVE_MISMATCH, *at_one, group="0")
    rep = report(mismatch, *_gone_rank_findings(op_ref(0, seq=2), 1), verdict=Verdict.DEFECT)
    # THEN the headline counts the mismatch, and says what follows from it
    assert headline(rep) == (
        "DEFECT: 1 communication defect, no deadlock (collective-mismatch); 2 findings "
        "follow from it (orphaned-wait, collective-missing)"
    )
    # AND once the mismatched ranks failed (gloo aborted them), the waits on them on
    # another group follow from it too
    on_world = op_ref(2, "barrier", seq=0, group="0")
    sub = finding(FindingKind.COLLECTIVE_MISMATCH, *[op_ref(r, seq=0, group="1") for r in (0, 1)])
    world_wait = finding(FindingKind.ORPHANED_WAIT, on_world, ranks=[0, 2], group="0")
    states = [rank_state(r, "failed") for r in (0, 1)] + [rank_state(r, "blocked") for r in (2, 3)]
    rep = report(sub, world_wait, ranks=states, verdict=Verdict.DEFECT)
    assert headline(rep).endswith("; 1 finding follows from it (orphaned-wait)")
    # AND a finding on another group, or before the mismatch, is a defect of its own
    other = finding(FindingKind.COLLECTIVE_MISSING, op_ref(0, seq=5, group="3"), group="3")
    before = finding(FindingKind.ORPHANED_WAIT, op_ref(0, seq=0), ranks=[0, 1], group="0")
    rep = report(mismatch, other, before, verdict=Verdict.DEFECT)
    assert headline(rep).startswith("DEFECT: 3 communication defects, no deadlock")


def test_findings_a_send_receive_size_mismatch_brings_about_follow_from_it() -> None:
    # GIVEN a size mismatch between ranks 2 and 3 (gloo aborts rank 3), then rank 0
    # waiting on rank 3 in a barrier that rank 3 never issued
    p2p = finding(FindingKind.P2P_MISMATCH, op_ref(2, "send", peer=3), op_ref(3, "recv", peer=2))
    barrier = op_ref(0, "barrier", seq=0)
    rep = report(p2p, *_gone_rank_findings(barrier, 3), verdict=Verdict.DEFECT)
    assert headline(rep) == (
        "DEFECT: 1 communication defect, no deadlock (p2p-mismatch); 2 findings follow from "
        "it (orphaned-wait, collective-missing)"
    )
    # AND a wait on a rank outside the mismatch is a defect of its own
    other = finding(FindingKind.ORPHANED_WAIT, barrier, ranks=[0, 1], group="0")
    assert headline(report(p2p, other, verdict=Verdict.DEFECT)).startswith(
        "DEFECT: 2 communication defects"
    )


def test_a_failed_job_names_the_rank_that_ended_before_a_collective_the_others_issued() -> None:
    # GIVEN rank 1 ended (os._exit, a crash or a kill dl2 could not tell) before
    # all_reduce #4 of the world, which ranks 0 and 2 issued and failed in
    issued = [op_ref(r, seq=4, file="/job/train.py", line=14) for r in (0, 2)]
    orphaned = [finding(FindingKind.ORPHANED_WAIT, op, ranks=[op.rank, 1]) for op in issued]
    missing = finding(FindingKind.COLLECTIVE_MISSING, *issued, ranks=[0, 1, 2])
    states = [rank_state(r, "failed") for r in range(3)]
    rep = report(*orphaned, missing, ranks=states, verdict=Verdict.JOB_FAILED)
    # THEN the headline says who ended before what, not "a reason other than communication"
    assert headline(rep) == (
        "JOB FAILED: rank 1 ended before all_reduce #4 of group 0, which ranks 0,2 issued "
        "at train.py:14; the others failed because of it"
    )
    # AND a rank that failed on its own with no such finding keeps the general headline
    alone = report(ranks=[rank_state(0, "failed")], verdict=Verdict.JOB_FAILED)
    assert headline(alone) == "JOB FAILED: the job failed for a reason other than communication"


def test_a_killed_rank_is_the_headline_when_its_launcher_ended_the_waiting_ones() -> None:
    # GIVEN rank 1 killed by a signal before all_reduce #3, which ranks 0 and 2 issued;
    # mp.spawn then ended rank 0 itself before its wait failed (no error of its own, no
    # orphaned wait), rank 2's wait failed on the closed connection
    issued = [op_ref(r, seq=3, file="/job/train.py", line=17) for r in (0, 2)]
    orphaned = finding(FindingKind.ORPHANED_WAIT, issued[1], ranks=[1, 2])
    missing = finding(FindingKind.COLLECTIVE_MISSING, *issued, ranks=[0, 1, 2])
    states = [rank_state(0, "failed"), rank_state(1, "killed"), rank_state(2, "failed")]
    rep = report(orphaned, missing, ranks=states, verdict=Verdict.JOB_FAILED)
    # THEN the kill is the headline: the rank ended while waiting on it failed with it
    assert headline(rep) == (
        "JOB FAILED: rank 1 was killed by a signal (the OOM killer, a scheduler, a kill, or "
        "the rank's own code); the others failed because of it"
    )


# -- deadlock cycles ----------------------------------------------------------------------


def test_sendsend_cycle_line_is_exact() -> None:
    # GIVEN two ranks that both send first
    rep = sendsend_deadlock()
    # WHEN rendered
    text = render(rep)
    # THEN the cycle is drawn on one line, right after the verdict (and job facts)
    cycle = "rank 0 send→1 (train.py:42) ⇢ rank 1 send→0 (train.py:57) ⇢ rank 0"
    assert cycle in text.splitlines()
    assert text.splitlines().index(cycle) == 5
    assert cycle_line(rep.findings[0]) == cycle


def test_three_rank_cycle_follows_the_finding_order() -> None:
    text = render(three_rank_cycle())
    assert (
        "rank 0 recv←2 (train.py:31) ⇢ rank 2 recv←1 (train.py:39) ⇢ "
        "rank 1 recv←0 (train.py:35) ⇢ rank 0"
    ) in text.splitlines()


def test_long_cycle_is_never_wrapped() -> None:
    # GIVEN an 8-rank cycle, far wider than 100 columns
    text = render(large())
    # THEN it still takes exactly one line
    (line,) = [line for line in text.splitlines() if line.startswith("rank 0 send→1")]
    assert line.endswith("rank 7 send→0 (train.py:140) ⇢ rank 0")
    assert line.count("⇢") == 8


def test_cycle_op_falls_back_to_rank_state() -> None:
    # GIVEN a deadlock finding that names its cycle but carries no ops
    send = op_ref(1, "send", peer=0, line=9)
    rep = report(
        finding(FindingKind.DEADLOCK, ranks=[0, 1], cycle=[0, 1]),
        ranks=[rank_state(0, waits_on=[1]), rank_state(1, op=send, waits_on=[0])],
    )
    # THEN the ranks' states supply what is known, and unknown ops are simply left out
    assert "rank 0 ⇢ rank 1 send→0 (train.py:9) ⇢ rank 0" in render(rep).splitlines()


def test_collective_in_cycle_names_group_and_seq() -> None:
    ops = [op_ref(0, "all_reduce", seq=3, line=42), op_ref(1, "broadcast", seq=3, peer=1, line=50)]
    rep = report(finding(FindingKind.DEADLOCK, *ops, cycle=[0, 1]))
    assert cycle_line(rep.findings[0]) == (
        "rank 0 all_reduce(group 0 #3) (train.py:42) ⇢ "
        "rank 1 broadcast(group 0 #3, root 1) (train.py:50) ⇢ rank 0"
    )


def test_ranks_stuck_behind_the_cycle_are_named() -> None:
    text = render(wildcard_wait())
    assert "rank 0 recv←any (train.py:12) ⇢ rank 1 recv←0 (train.py:20) ⇢ rank 0" in text
    assert "also stuck behind it: rank 2" in lines_of(text)


# -- rank table ---------------------------------------------------------------------------


def test_rank_table_shows_op_signature_source_and_waits() -> None:
    rows = lines_of(render(sendsend_deadlock()))
    header = rows.index("rank   status    stuck in   signature             source        waits on")
    assert rows[header + 2] == "0      blocked   send→1     float32[1024] tag 0   train.py:42   1"
    assert rows[header + 3] == "1      blocked   send→0     float32[1024] tag 0   train.py:57   0"


def test_or_wait_is_shown_as_any_of() -> None:
    rows = lines_of(render(wildcard_wait()))
    row0 = next(r for r in rows if r.startswith("0 "))
    assert row0.endswith("any of 1,2")
    assert "recv←any" in row0


def test_idle_ranks_are_folded_into_one_row() -> None:
    rep = report(ranks=[rank_state(r, "exited") for r in range(6)] + [rank_state(6, "failed")])
    rows = lines_of(render(rep))
    assert "0-5    exited" in rows
    assert "6      failed" in rows


def test_orphaned_wait_shows_the_exited_peer() -> None:
    text = render(orphaned_wait())
    rows = lines_of(text)
    assert "1      exited" in rows
    assert "orphaned-wait" in rows
    assert "rank 0  recv←1  int64[8] tag 7  train.py:88 in evaluate" in rows


def test_large_rank_table_is_capped() -> None:
    # GIVEN 40 ranks each blocked somewhere different
    states = [rank_state(r, op=op_ref(r, "send", peer=r + 1), waits_on=[r + 1]) for r in range(40)]
    rows = lines_of(render(report(ranks=states)))
    # THEN 32 rows are shown and the rest counted
    assert "... and 8 more ranks (8 blocked)" in rows
    assert not any(r.startswith("33 ") for r in rows)


# -- other findings -----------------------------------------------------------------------


def test_collective_mismatch_shows_ranks_side_by_side() -> None:
    rows = lines_of(render(collective_mismatch()))
    i = rows.index("first divergence:")
    assert (
        rows[i + 1] == "ranks 0-2  all_reduce(group 0 #3)  float32[1024] sum  train.py:42 in step"
    )
    assert (
        rows[i + 2]
        == "rank 3     all_reduce(group 0 #3)  float16[2048] sum  train.py:61 in step_amp"
    )


def test_collective_missing_marks_the_absent_rank() -> None:
    ops = [op_ref(r, "barrier", seq=5) for r in (0, 1)]
    rep = report(finding(FindingKind.COLLECTIVE_MISSING, *ops, ranks=[0, 1, 2], group="0"))
    rows = lines_of(render(rep))
    assert "ranks 0,1  barrier(group 0 #5)  train.py:42" in rows
    assert "rank 2     (never called)" in rows


def test_api_and_function_are_shown() -> None:
    op = op_ref(2, "all_gather", api="all_gather_object", seq=0, function="sync_meta")
    rows = lines_of(render(report(finding(FindingKind.P2P_UNMATCHED, op))))
    assert "rank 2  all_gather(group 0 #0) via all_gather_object  train.py:42 in sync_meta" in rows


def test_many_findings_are_grouped_and_capped() -> None:
    text = render(large())
    rows = lines_of(text)
    # findings of one kind share a heading with their count
    assert "collective-mismatch (12)" in rows
    assert "... and 7 more collective-mismatch findings" in rows
    # one fix line per distinct hint, however many findings share it
    assert "• collective-mismatch (12 findings): Give every rank the same tensor shape." in rows
    assert text.count("Give every rank the same tensor shape.") == 1
    # warnings capped too
    assert "... and 5 more warnings" in rows
    assert "! rank 1: record 109 truncated" in rows
    assert "record 110" not in text


def test_many_ops_in_one_finding_are_capped() -> None:
    ops = [op_ref(r, "send", peer=r + 1, seq=r) for r in range(12)]
    rows = lines_of(render(report(finding(FindingKind.P2P_UNMATCHED, *ops))))
    assert "... and 4 more operations" in rows


def test_fix_hints_come_after_findings_and_warnings_last() -> None:
    text = render(large())
    assert text.index("Findings") < text.index("Fix") < text.index("Warnings")


def test_text_that_looks_like_markup_is_printed_as_is() -> None:
    op = op_ref(0, "send", peer=1, detail="[bold]x[/bold] float32[4]")
    rep = report(finding(FindingKind.P2P_UNMATCHED, op, message="see [red]this[/red]"))
    text = render(rep)
    assert "[bold]x[/bold] float32[4]" in text
    assert "see [red]this[/red]" in text


# -- output properties --------------------------------------------------------------------


def test_no_colour_by_default_and_colour_on_request() -> None:
    rep = sendsend_deadlock()
    assert "\x1b[" not in render(rep)
    coloured = render(rep, color=True)
    assert "\x1b[" in coloured
    assert ConsoleRenderer(color=False, width=100).render_for(rep, tty=True) == render(rep)
    assert "\x1b[" in ConsoleRenderer(width=100).render_for(rep, tty=True)


def test_width_option_and_no_trailing_blanks() -> None:
    text = render(large(), width=80)
    long_lines = [line for line in text.splitlines() if len(line) > 80]
    assert all(line.startswith("rank 0 send→1") for line in long_lines)  # only the cycle
    assert all(line == line.rstrip() for line in text.splitlines())


def test_same_report_renders_identically() -> None:
    assert render(large()) == render(large())


def test_empty_report() -> None:
    text = render(report())
    assert "OK: no communication defect found (no ranks traced)" in text
    assert "Findings" not in text
    assert "rank" not in text.replace("ranks traced", "")


# -- helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "label"),
    [
        (op_ref(op="send", peer=1), "send→1"),
        (op_ref(op="isend", peer=3), "isend→3"),
        (op_ref(op="recv", peer=2), "recv←2"),
        (op_ref(op="recv", peer=None), "recv←any"),
        (op_ref(op="all_reduce", seq=3), "all_reduce(group 0 #3)"),
        (op_ref(op="all_reduce"), "all_reduce(group 0)"),
        (op_ref(op="reduce", group="tp", seq=0, peer=2), "reduce(group tp #0, root 2)"),
    ],
)
def test_op_label(op: object, label: str) -> None:
    assert op_label(op) == label  # type: ignore[arg-type]


def test_rank_list_folds_runs() -> None:
    assert rank_list([]) == ""
    assert rank_list([1, 2]) == "1,2"
    assert rank_list([3, 0, 1, 2, 5, 7, 8, 9, 9]) == "0-3,5,7-9"


@pytest.mark.parametrize("verdict", [Verdict.DEADLOCK, Verdict.DEFECT])
def test_the_job_line_says_deadlock_only_under_a_deadlock(verdict: Verdict) -> None:
    # GIVEN a job dl2 stopped on ranks blocked for good (its stop reason "deadlock"),
    # whose analysis found a deadlock, or only waits on a failed rank (a defect)
    missing = finding(FindingKind.COLLECTIVE_MISSING, op_ref(0, seq=1), ranks=[0, 1])
    rep = report(missing, verdict=verdict, job={"command": ["t.py"], "ended": "deadlock"})
    text = render(rep)
    # THEN the job line says "deadlock" only under a deadlock
    if verdict is Verdict.DEADLOCK:
        assert "ended: deadlock" in text
    else:
        assert "ended: stopped by dl2 (ranks blocked for good)" in text
        assert "ended: deadlock" not in text


def test_a_p2p_op_on_another_group_than_the_default_names_it() -> None:
    assert op_label(op_ref(0, op="send", peer=1)) == "send→1"
    assert op_label(op_ref(0, op="send", peer=1, group="2")) == "send→1 (group 2)"
