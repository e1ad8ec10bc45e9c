"""The verdict model: how the job ended decides between hang, interrupted, job-failed, ok.

Each case has its twin: the same trace read under another ending, or the healthy shape.
"""

from __future__ import annotations

from dataclasses import replace

from dl2.analysis import analyze
from dl2.analysis.ending import HANG_AFTER_S
from dl2.render.console import headline
from dl2.report import FindingKind
from dl2.report import Verdict
from dl2.trace.session import ALIVE
from dl2.trace.session import EXITED
from dl2.trace.session import FAILED
from dl2.trace.session import KILLED
from dl2.trace.session import Session
from trace_builders import RankBuilder
from trace_builders import ranks
from trace_builders import session


def _rank1_outside_communication() -> list[RankBuilder]:
    """Rank 0 blocked in its second all_reduce; rank 1 back in Python code after its first."""
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.call("all_reduce", 5, count=4)
    r0.call("all_reduce", 9, count=4, complete=False)
    r1.state([], "python", stack=(("train.py", 7, "wait_for_file"), ("train.py", 8, "main")))
    return [r0, r1]


def _ended(built: Session, ending: str | None) -> Session:
    return replace(built, ending=ending)


def test_ranks_killed_together_while_one_waits_on_a_rank_in_python_is_a_hang():
    # GIVEN both ranks killed from outside (no end record, no error), rank 0 blocked
    killed = session(_rank1_outside_communication(), states={0: KILLED, 1: KILLED})
    report = analyze(_ended(killed, "finished"))
    # THEN a hang naming the stuck op and line, and where the other rank was
    assert report.verdict is Verdict.HANG and report.exit_code == 3
    hang = report.findings[0]
    assert hang.kind is FindingKind.HANG and hang.ranks == (0, 1)
    assert [(o.rank, o.op, o.line) for o in hang.ops] == [(0, "all_reduce", 9)]
    assert "rank 1 (running Python code at train.py:7 in wait_for_file)" in hang.summary
    # the twin: the launcher did not say how they ended (a bare directory): not a hang
    unknown = analyze(_ended(session(_rank1_outside_communication()), None))
    assert unknown.verdict is Verdict.OK


def test_a_rank_that_crashed_alone_is_a_failure_not_a_hang():
    # GIVEN rank 1 crashed (SIGSEGV: FAILED) and rank 0, blocked on it, was then killed
    crashed = session(_rank1_outside_communication(), states={0: KILLED, 1: FAILED})
    report = analyze(_ended(crashed, "finished"))
    # THEN the crash is the cause: the job failed, rank 0's wait is orphaned
    assert report.verdict is Verdict.JOB_FAILED
    assert FindingKind.HANG not in {f.kind for f in report.findings}
    # and a rank that raised (its exit hook wrote "end") failed on its own too
    builders = _rank1_outside_communication()
    builders[1].end()
    raised = analyze(_ended(session(builders, states={0: FAILED, 1: FAILED}), "finished"))
    assert raised.verdict is not Verdict.HANG


def test_a_rank_killed_by_a_signal_mid_job_is_named_as_the_cause_at_any_world_size():
    # GIVEN rank 1 killed by a signal (SIGKILL: the OOM killer) before its all_reduce #1;
    # every other rank's all_reduce then failed ("Connection closed") and it exited
    for world in (2, 3, 4):
        builders = ranks(world)
        for r in builders:
            r.call("all_reduce", 5)
        for r in builders:
            if r.rank != 1:
                r.wait(r.issue("all_reduce", 9), err="RuntimeError: Connection closed by peer")
                r.end(err="RuntimeError: Connection closed by peer", line=9)
        states = {r.rank: FAILED for r in builders} | {1: KILLED}
        report = analyze(_ended(session(builders, states=states), "finished"))
        # THEN the job failed (no communication defect of the program), because of rank 1
        assert report.verdict is Verdict.JOB_FAILED, (world, report.findings)
        assert [s.rank for s in report.ranks if s.status.value == "killed"] == [1]
        assert headline(report).startswith("JOB FAILED: rank 1 was killed by a signal")
        missing = next(f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISSING)
        assert "killed by a signal" in missing.message and "out-of-memory" in missing.hint
        assert "rank 1 was killed by a signal" in report.findings[0].message


def test_ranks_stuck_in_a_group_creation_they_all_entered_are_a_hang_naming_it():
    # GIVEN both ranks inside init_process_group (a second generation whose rendezvous
    # never connects), when dl2's hang timeout stopped the job
    builders = ranks(2)
    for r in builders:
        r.call("all_reduce", 5)
        r.issue(
            "create_group", 15, api="init_process_group", ranks=[0, 1], returned=False,
            dtype=None, count=None,
        )  # fmt: skip
    stopped = session(builders, states={0: ALIVE, 1: ALIVE})
    report = analyze(_ended(stopped, "hang-timeout"))
    # THEN a hang naming the call and its line, not "ok" (the live verdict and a later
    # dl2 analyze of the directory agree)
    assert report.verdict is Verdict.HANG, report.findings
    hang = report.findings[0]
    assert hang.kind is FindingKind.HANG and hang.ranks == (0, 1)
    assert "inside init_process_group (train.py:15)" in hang.message
    # the twin: one rank never entered it: that rank is the one waited on, as before
    lone = ranks(2)
    lone[0].issue("create_group", 15, api="init_process_group", ranks=[0, 1], returned=False)
    assert "every member" not in " ".join(
        f.message for f in analyze(_ended(session(lone), "hang-timeout")).findings
    )


def test_a_cycle_of_ranks_whose_heartbeat_threads_keep_them_fresh_is_named_at_the_stop():
    # GIVEN recv/recv between the main threads of two ranks that each have a heartbeat
    # thread alive (it all_reduces on its own group: their progress clocks stay fresh),
    # when the user stopped dl2
    def job(cycle: bool) -> list[RankBuilder]:
        r0, r1, r2 = ranks(3)
        for r in (r0, r1):
            r.threads(1)
        r0.call("recv", 27, peer=1, complete=False)
        r1.call("recv", 29, peer=0 if cycle else 2, complete=False)
        r2.state([], "python", stack=(("train.py", 40, "main"),))
        return [r0, r1, r2]

    quiet = {0: 0.1, 1: 0.1, 2: 0.1}
    stopped = session(job(cycle=True), states={0: ALIVE, 1: ALIVE, 2: ALIVE})
    report = analyze(_ended(stopped, "interrupted"), quiet=quiet)
    # THEN the cycle is named (not "no rank was stuck"), hedged: the threads were alive
    assert report.verdict is Verdict.HANG, report.findings
    hang = report.findings[0]
    assert hang.cycle == (0, 1) and sorted(o.line for o in hang.ops) == [27, 29]
    assert "unless another thread" in hang.message
    # the twin: rank 1 waits on rank 2, which runs Python: no cycle, no such claim
    twin = session(job(cycle=False), states={0: ALIVE, 1: ALIVE, 2: ALIVE})
    assert analyze(_ended(twin, "interrupted"), quiet=quiet).verdict is Verdict.INTERRUPTED
    # and when each rank's innermost call is its heartbeat thread's all_reduce on a group
    # of its own, matched and about to complete (the rank then reads as running)
    beating = job(cycle=True)
    for r in beating[:2]:
        r.call("all_reduce", 12, gid="7", tid=2, complete=False)
    report = analyze(_ended(session(beating), "interrupted"), quiet=quiet)
    assert report.verdict is Verdict.HANG, report.findings
    assert sorted(o.line for o in report.findings[0].ops) == [27, 29]


def test_dl2s_hang_timeout_is_a_hang_at_once_and_a_users_interrupt_after_a_while():
    stopped = session(_rank1_outside_communication(), states={0: ALIVE, 1: ALIVE})
    report = analyze(_ended(stopped, "hang-timeout"), quiet={0: 0.5, 1: 0.5})
    assert report.verdict is Verdict.HANG
    # Ctrl-C while rank 0 had waited long: a hang; after a short wait: interrupted
    long = analyze(_ended(stopped, "interrupted"), quiet={0: HANG_AFTER_S + 1, 1: 9.0})
    assert long.verdict is Verdict.HANG and "for 4 s" in long.findings[0].message
    short = analyze(_ended(stopped, "interrupted"), quiet={0: 0.2, 1: 0.2})
    assert short.verdict is Verdict.INTERRUPTED and short.exit_code == 130
    assert short.findings == ()


def test_an_interrupt_keeps_a_proven_deadlock_and_reports_defects_found_so_far():
    r0, r1 = ranks(2)
    r0.call("send", 10, peer=1, complete=False)
    r1.call("send", 20, peer=0, complete=False)
    deadlocked = session([r0, r1], states={0: ALIVE, 1: ALIVE})
    assert analyze(_ended(deadlocked, "interrupted")).verdict is Verdict.DEADLOCK
    # a finished mismatch, then Ctrl-C: interrupted, the mismatch listed
    r0, r1 = ranks(2)
    r0.call("all_reduce", 5, count=4)
    r1.call("all_reduce", 5, count=8)
    report = analyze(_ended(session([r0, r1], states={0: ALIVE, 1: ALIVE}), "interrupted"))
    assert report.verdict is Verdict.INTERRUPTED
    assert [f.kind for f in report.findings] == [FindingKind.COLLECTIVE_MISMATCH]


def test_a_clean_run_is_ok_and_a_missing_trace_makes_it_incomplete():
    r0, r1, r2 = ranks(3)
    for r in (r0, r1, r2):
        r.call("all_reduce", 5, count=4)
        r.end()
    assert analyze(session([r0, r1, r2], states=dict.fromkeys(range(3), EXITED))).verdict is (
        Verdict.OK
    )
    report = analyze(session([r0, r2], states={0: EXITED, 2: EXITED}))
    assert report.verdict is Verdict.INCOMPLETE and report.exit_code == 5
    assert report.gaps == ("no readable trace from rank(s) 1",)


def test_a_healthy_job_killed_mid_step_is_not_a_hang():
    # GIVEN ranks killed together while rank 0 had waited 0.3 s on rank 1's compute
    killed = session(_rank1_outside_communication(), states={0: KILLED, 1: KILLED})
    report = analyze(_ended(killed, "finished"), quiet={0: 0.3, 1: 0.3})
    # THEN no hang: a job caught mid-step, stopped from outside (never "ok")
    assert report.verdict is Verdict.INTERRUPTED and report.exit_code == 130


def test_ranks_killed_after_another_rank_exited_are_not_killed_from_outside():
    # GIVEN rank 1 raised and ran its exit hook (an end record; under torchrun or
    # mp.spawn its exit status is not ours to see), then its launcher killed rank 0
    builders = _rank1_outside_communication()
    builders[1].end()
    report = analyze(_ended(session(builders, states={0: KILLED, 1: EXITED}), "finished"))
    # THEN no hang and no interrupt: the rank that left never issued rank 0's collective
    assert report.verdict is Verdict.DEFECT
    assert [(f.kind, f.ranks) for f in report.findings] == [
        (FindingKind.COLLECTIVE_MISSING, (0, 1))
    ]


def test_a_receive_whose_matching_isend_was_dropped_waits_on_the_dropper_for_good():
    # GIVEN rank 0 drops the work of an isend to rank 1 and enters a barrier; rank 1 sits
    # in the matching recv
    def build(dropped: bool) -> Session:
        r0, r1 = ranks(2)
        sent = r0.isend(19, peer=1, count=16)
        r0.ret(sent)
        if dropped:
            r0.drop(sent)
        r0.call("barrier", 23, complete=False)
        r1.call("recv", 22, peer=0, count=16, complete=False)
        return session([r0, r1], states={0: ALIVE, 1: ALIVE})

    # THEN a deadlock that names the dropped isend, and the dropped work itself
    report = analyze(build(dropped=True))
    assert report.verdict is Verdict.DEADLOCK
    cycle = report.findings[0]
    assert cycle.cycle == (0, 1) and "dropped the Work of its matching isend" in cycle.message
    assert "train.py:19" in cycle.message and "wait()" in cycle.hint
    unwaited = [f for f in report.findings if f.kind is FindingKind.UNWAITED_WORK]
    assert [(o.rank, o.line) for o in unwaited[0].ops] == [(0, 19), (1, 22)]
    # the twin: the isend still live, the recv is about to complete: no deadlock
    assert analyze(build(dropped=False)).verdict is Verdict.OK


def test_a_wide_hang_is_one_finding_naming_the_rank_outside_communication():
    # GIVEN 1,200 ranks: 1,199 blocked in an all_reduce rank 1,199 never issued, it in Python
    builders = ranks(1200)
    for r in builders[:-1]:
        r.call("all_reduce", 5, count=4, complete=False)
    builders[-1].state([], "python", stack=(("train.py", 7, "load"),))
    stopped = session(builders, states=dict.fromkeys(range(1200), ALIVE))
    report = analyze(_ended(stopped, "interrupted"), quiet=dict.fromkeys(range(1200), 9.0))
    # THEN one hang finding: every blocked rank, the one they wait on and where it was
    assert report.verdict is Verdict.HANG
    (hang,) = [f for f in report.findings if f.kind is FindingKind.HANG]
    assert hang.ranks == tuple(range(1200)) and len(hang.ops) == 1199
    assert hang.summary.startswith("ranks 0-1198 ")
    assert "waiting on rank 1199 (running Python code at train.py:7 in load)" in hang.summary


def test_a_second_wait_on_a_completed_p2p_work_is_a_deadlock_naming_both_waits():
    # GIVEN an isend/irecv pair each waited on, then waited on again (gloo: the second
    # wait waits for another message), until dl2's hang timeout stopped the job
    r0, r1 = ranks(2)
    send = r0.isend(14, peer=1)
    recv = r1.issue("recv", 16, peer=0, api="irecv", **{"async": True})
    for rank, op_id in ((r0, send), (r1, recv)):
        rank.wait(op_id, line=17)
        rank.wait(op_id, complete=False, line=18)
    report = analyze(_ended(session([r0, r1]), "hang-timeout"))
    # THEN neither can ever be released, each on its own: each finding names the work,
    # both waits, and why
    assert report.verdict is Verdict.DEADLOCK
    first, second = [f for f in report.findings if f.kind is FindingKind.DEADLOCK]
    assert (first.ranks, second.ranks) == ((0,), (1,))
    assert [(o.rank, o.line, o.wait_line) for f in (first, second) for o in f.ops] == [
        (0, 14, 18),
        (1, 16, 18),
    ]
    assert "rank 0 waits a second time on the work of its isend to rank 1" in first.message
    assert "rank 1 waits a second time on the work of its irecv from rank 0" in second.message
    assert "whose first wait returned (line 17)" in first.message
    assert "Call wait() once per isend/irecv work" in first.hint


def test_a_rank_waiting_on_one_in_a_second_p2p_wait_is_deadlocked_with_it():
    # GIVEN rank 1 waits its irecv twice (lines 13, 14) and rank 0 waits in the barrier
    # that rank 1 never reaches, the job still live (no ending yet)
    r0, r1 = ranks(2)
    send = r0.isend(9, peer=1)
    r0.wait(send, line=10)
    recv = r1.irecv(12, peer=0)
    r1.wait(recv, line=13)
    r1.wait(recv, complete=False, line=14)
    r0.call("barrier", 16, complete=False)
    report = analyze(session([r0, r1], states=dict.fromkeys(range(2), ALIVE)))
    # THEN a deadlock of both: rank 1 can never leave its wait, rank 0 waits on rank 1
    assert report.verdict is Verdict.DEADLOCK
    (dead,) = [f for f in report.findings if f.kind is FindingKind.DEADLOCK]
    assert dead.ranks == (0, 1)
    assert "rank 1 waits a second time on the work of its irecv from rank 0" in dead.message
    assert "(train.py:12, waited at line 14), whose first wait returned (line 13)" in dead.message
    # a first wait in another file is named with its file
    r0, r1 = ranks(2)
    r0.wait(r0.isend(9, peer=1), line=10)
    recv = r1.irecv(12, peer=0)
    r1.wait(recv, stack=(("helpers.py", 5, "finish"), ("train.py", 13, "main")))
    r1.wait(recv, complete=False, line=14)
    r0.call("barrier", 16, complete=False)
    report = analyze(session([r0, r1], states=dict.fromkeys(range(2), ALIVE)))
    (dead,) = [f for f in report.findings if f.kind is FindingKind.DEADLOCK]
    assert "whose first wait returned (helpers.py:5)" in dead.message
    # the twin: a collective's work waited on twice returns at once (not a finding), and
    # so does a P2P work's second wait that returned
    r0, r1 = ranks(2)
    for r in (r0, r1):
        work = r.issue("all_reduce", 5, count=4, **{"async": True})
        r.wait(work, line=6)
        r.wait(work, complete=False, line=7)
    assert analyze(session([r0, r1], states=dict.fromkeys(range(2), ALIVE))).verdict is not (
        Verdict.DEADLOCK
    )
    r0, r1 = ranks(2)
    send = r0.isend(9, peer=1)
    recv = r1.irecv(12, peer=0)
    for r, op_id in ((r0, send), (r1, recv)):
        r.wait(op_id, line=13)
        r.wait(op_id, line=14)
    assert analyze(session([r0, r1], states=dict.fromkeys(range(2), ALIVE))).verdict is Verdict.OK
    # and a first wait on a send the watchdog saw complete (NCCL's works report it; a
    # gloo P2P work only once waited) is no second wait, while it is still open
    r0, r1 = ranks(2)
    send = r0.isend(9, peer=1)
    recv = r1.irecv(12, peer=0)
    r1.wait(recv, line=13)
    r0.done(send)
    r0.wait(send, complete=False, line=14)
    assert analyze(session([r0, r1], states=dict.fromkeys(range(2), ALIVE))).verdict is not (
        Verdict.DEADLOCK
    )


def test_a_done_after_a_failed_wait_leaves_the_op_failed():
    # GIVEN rank 0's irecv from rank 1, whose wait raised when rank 1 exited, and the
    # ``done`` an older recorder wrote after it (gloo calls a failed work completed)
    r0, r1 = ranks(2)
    recv = r0.irecv(10, peer=1)
    r0.wait(recv, err="RuntimeError: Connection closed by peer")
    r0.done(recv)
    r0.end("exit", err="RuntimeError: Connection closed by peer")
    r1.end()
    states = {0: FAILED, 1: EXITED}
    report = analyze(replace(session([r0, r1]), process_states=states))
    # THEN the failure is explained by rank 1's exit, not left to "job failed"
    assert report.verdict is Verdict.DEFECT
    assert FindingKind.ORPHANED_WAIT in {f.kind for f in report.findings}


def test_calls_every_member_issued_that_never_complete_are_named_at_the_hang_timeout():
    # GIVEN both ranks inside barrier #0, which both issued (gloo paired its messages
    # with an earlier, dropped op), when dl2's hang timeout ended the job
    r0, r1 = ranks(2)
    r0.call("barrier", 30, complete=False)
    r1.call("barrier", 31, complete=False)
    stopped = replace(session([r0, r1]), process_states={0: ALIVE, 1: ALIVE}, ending="hang-timeout")
    report = analyze(stopped, quiet={0: 20.0, 1: 20.0})
    (finding,) = report.findings
    assert finding.kind is FindingKind.HANG
    assert {(o.rank, o.line) for o in finding.ops} == {(0, 30), (1, 31)}


def test_a_mismatch_between_two_threads_collectives_says_so():
    # GIVEN rank 0's metrics thread (tid 2) and main thread (tid 1) both reducing on the
    # world group, rank 1's in the other order: position #0 pairs count 2 with count 1
    r0, r1 = ranks(2)
    r0.call("all_reduce", 14, count=2, tid=2)
    r0.call("all_reduce", 19, count=1, tid=1, complete=False)
    r1.call("all_reduce", 19, count=1, tid=1)
    r1.call("all_reduce", 14, count=2, tid=2, complete=False)
    report = analyze(session([r0, r1]))
    (mismatch,) = [f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISMATCH]
    assert "from more than one thread" in mismatch.hint
    assert "Ranks 0 and 1 issue collectives on group 0" in mismatch.hint


def test_a_hang_through_a_ranks_worker_thread_is_read_as_the_cycle_it_closes():
    # GIVEN rank 0's worker thread in an all_reduce on group 1 that rank 1's worker
    # (finished) never joins, rank 0's main thread outside communication (a join), and
    # rank 1's main thread in a barrier that waits on rank 0
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.create_group("1", [0, 1])
        r.threads(1)
    r1.threads(0)
    r0.call("all_reduce", 14, gid="1", tid=2, complete=False)
    r1.call("barrier", 27, tid=1, complete=False)
    stopped = replace(session([r0, r1]), process_states={0: ALIVE, 1: ALIVE}, ending="hang-timeout")
    report = analyze(stopped, quiet={0: 20.0, 1: 20.0})
    (finding,) = report.findings
    assert finding.kind is FindingKind.HANG
    # the cycle through rank 0's worker and rank 1's barrier, which rank 0's other
    # thread (its main one, in a join) might have released
    assert {(o.rank, o.line) for o in finding.ops} == {(0, 14), (1, 27)}
    assert "another thread of rank 0" in finding.message, finding.message


def _mismatch_hint_of(line0: int, line1: int) -> str:
    r0, r1 = ranks(2)
    r0.call("all_reduce", line0, count=1)
    r1.call("all_reduce", line1, count=8)
    findings = analyze(session([r0, r1])).findings
    (finding,) = [f for f in findings if f.kind is FindingKind.COLLECTIVE_MISMATCH]
    return finding.hint


def test_sizes_that_differ_between_two_call_sites_point_at_an_extra_collective():
    # GIVEN rank 0's metric all_reduce (line 11, one float) meeting rank 1's gradient
    # all_reduce (line 22, eight floats): rank 0 logged once more than rank 1
    hint = _mismatch_hint_of(11, 22)
    assert "from different lines of the program" in hint
    assert "pad it" not in hint
    # and the same line with different sizes names the loop's order, a skip and padding
    same_line = _mismatch_hint_of(11, 11)
    assert "different order" in same_line and "pad it" in same_line


def test_a_rank_waited_on_inside_a_matched_call_is_named_in_it():
    # GIVEN rank 1's broadcast #0 that returned at once (meta tensors: no data moved) and
    # rank 0 still inside its broadcast #0, while rank 1 waits in barrier #1
    r0, r1 = ranks(2)
    r0.call("broadcast", 13, root=0, complete=False)
    r1.call("broadcast", 13, root=0)
    r1.call("barrier", 14, complete=False)
    stopped = replace(session([r0, r1]), process_states={0: ALIVE, 1: ALIVE}, ending="hang-timeout")
    report = analyze(stopped, quiet={0: 20.0, 1: 20.0})
    text = " ".join(f.message for f in report.findings)
    assert "rank 0 (still inside its broadcast" in text and "train.py:13" in text, text
    assert "did not record" not in text


def test_a_collective_mismatch_leads_the_failures_it_causes():
    from dl2.analysis import analyze
    from dl2.report import FindingKind
    from dl2.trace.session import FAILED
    from trace_builders import ranks
    from trace_builders import session

    # GIVEN ranks 0 and 1 disagree on an all_reduce of their own group (gloo aborts rank
    # 1 in it), and rank 2's all_reduce on the world then fails: its peers never get there
    r0, r1, r2 = ranks(3)
    for r in (r0, r1, r2):
        r.create_group("1", [0, 1])
    r0.wait(r0.issue("all_reduce", 20, gid="1", count=4), err="Connection closed by peer")
    r1.call("all_reduce", 20, gid="1", count=8, complete=False)
    r2.wait(r2.issue("all_reduce", 30), err="Connection closed by peer")
    report = analyze(session([r0, r1, r2], states={0: FAILED, 1: FAILED, 2: FAILED}))
    kinds = [f.kind for f in report.findings]
    # THEN the mismatch, the cause, comes first (the headline), then what followed
    assert FindingKind.ORPHANED_WAIT in kinds or FindingKind.COLLECTIVE_MISSING in kinds
    assert kinds[0] is FindingKind.COLLECTIVE_MISMATCH, kinds


def test_a_call_rejected_on_its_rank_leads_the_waits_it_orphaned():
    from dl2.analysis import analyze
    from dl2.report import FindingKind
    from dl2.trace.session import FAILED
    from trace_builders import ranks
    from trace_builders import session

    # GIVEN ranks 1 and 2 each have their all_to_all on their group rejected by gloo on
    # their own rank (a local check), and their programs end; rank 0's barrier then
    # fails: its peers are gone
    r0, r1, r2 = ranks(3)
    invalid = "RuntimeError: ProcessGroupGloo::alltoall: invalid tensor size at index 1"
    for r in (r0, r1, r2):
        r.create_group("1", [1, 2])
    for r in (r1, r2):
        r.wait(r.issue("all_to_all", 16, gid="1"), err=invalid)
        r.end(err=invalid, line=16)
    r0.wait(r0.issue("barrier", 19), err="RuntimeError: Connection closed by peer")
    report = analyze(session([r0, r1, r2], states={0: FAILED, 1: FAILED, 2: FAILED}))
    kinds = [f.kind for f in report.findings]
    # THEN the rejected call leads, before the orphaned wait it caused
    assert kinds[0] is FindingKind.FAILED_CALL, kinds
    assert FindingKind.ORPHANED_WAIT in kinds
    assert "invalid tensor size" in report.findings[0].message
