"""Analysis over traces built in code: deadlocks, mismatches, orphans and clean twins."""

from __future__ import annotations

import pytest

from dl2.analysis import ANALYSES
from dl2.analysis import analyze
from dl2.report import FindingKind
from dl2.report import Verdict
from dl2.trace.schema import NO_RANK
from dl2.trace.session import ALIVE
from dl2.trace.session import EXITED
from dl2.trace.session import FAILED
from dl2.trace.session import KILLED
from dl2.trace.session import Session
from dl2.trace.session import build_session
from trace_builders import ranks
from trace_builders import session


def kinds(report):
    return [f.kind for f in report.findings]


def test_send_send_cycle_is_a_deadlock_with_both_lines():
    # GIVEN two ranks that both send first and are stuck in their sends
    r0, r1 = ranks(2)
    r0.call("send", 10, peer=1, complete=False)
    r1.call("send", 20, peer=0, complete=False)
    # WHEN analysed
    report = analyze(session([r0, r1]))
    # THEN a deadlock cycle 0 -> 1 -> 0 names both send lines
    assert report.verdict is Verdict.DEADLOCK
    first = report.findings[0]
    assert first.kind is FindingKind.DEADLOCK
    assert first.cycle == (0, 1)
    assert [(o.rank, o.op, o.line) for o in first.ops] == [(0, "send", 10), (1, "send", 20)]
    assert "send first" in first.hint


def test_a_helper_thread_that_died_is_named_in_the_cycle_it_caused():
    # GIVEN rank 1's sender thread died of a KeyError (line 14), so rank 0 waits in its
    # recv while rank 1's main thread went on to the barrier
    r0, r1 = ranks(2)
    r1.thread_error("Thread-1 (send_metrics)", "KeyError: 'acc'", 14)
    r0.call("recv", 25, peer=1, complete=False)
    r1.call("barrier", 28, complete=False)
    report = analyze(session([r0, r1]))
    # THEN the cycle says what the thread died of, and the fix is the thread's
    assert report.verdict is Verdict.DEADLOCK
    first = report.findings[0]
    assert first.cycle == (0, 1)
    assert (
        "rank 1's thread 'Thread-1 (send_metrics)' ended with an uncaught KeyError: 'acc', "
        "raised at train.py:14 in worker" in first.message
    )
    assert first.hint.startswith("Rank 1's thread 'Thread-1 (send_metrics)' died")
    assert not any("thread" in w for w in report.warnings)  # said once, in the finding


def test_a_thread_that_died_beside_a_send_send_cycle_is_noted_not_blamed():
    # GIVEN a send/send cycle of the main threads, and an unrelated logger thread that died
    r0, r1 = ranks(2)
    r1.thread_error("logger", "OSError: disk full", 7)
    r0.call("send", 10, peer=1, complete=False)
    r1.call("send", 20, peer=0, complete=False)
    first = analyze(session([r0, r1])).findings[0]
    # THEN the cycle notes the thread, and the fix is the send/send one
    assert "rank 1's thread 'logger' ended with an uncaught OSError: disk full" in first.message
    assert "send first" in first.hint and "logger" not in first.hint


def test_a_helper_thread_that_died_is_a_warning_when_no_finding_names_it():
    # GIVEN a clean run in which one rank's helper thread died
    r0, r1 = ranks(2)
    r0.thread_error("uploader", "OSError: disk full", 7)
    for r in (r0, r1):
        r.call("all_reduce", 10)
        r.end()
    report = analyze(session([r0, r1]))
    # THEN no finding, and the warning names it
    assert report.verdict is Verdict.OK and report.findings == ()
    assert (
        "rank 0's thread 'uploader' ended with an uncaught OSError: disk full, raised at "
        "train.py:7 in worker" in report.warnings
    )


def test_three_rank_recv_ring_cycle():
    rs = ranks(3)
    for r in rs:
        r.call("recv", 5 + r.rank, peer=(r.rank - 1) % 3, complete=False)
    report = analyze(session(rs))
    assert report.verdict is Verdict.DEADLOCK
    assert report.findings[0].cycle == (0, 2, 1)
    assert len(report.findings[0].ops) == 3


def test_matched_send_is_not_a_deadlock():
    # GIVEN rank 0 stuck in a send whose recv rank 1 has posted (transient state)
    r0, r1 = ranks(2)
    r0.call("send", 10, peer=1, complete=False)
    r1.call("recv", 20, peer=0, complete=False)
    report = analyze(session([r0, r1]))
    assert report.verdict is Verdict.OK
    assert report.findings == ()


def test_even_odd_ring_completed_is_clean():
    rs = ranks(4)
    for r in rs:
        nxt, prv = (r.rank + 1) % 4, (r.rank - 1) % 4
        if r.rank % 2 == 0:
            r.call("send", 10, peer=nxt)
            r.call("recv", 11, peer=prv)
        else:
            r.call("recv", 12, peer=prv)
            r.call("send", 13, peer=nxt)
        r.end()
    report = analyze(session(rs))
    assert report.verdict is Verdict.OK, report.findings
    assert all(s.status == "exited" for s in report.ranks)


def test_wrong_tag_is_explained():
    r0, r1 = ranks(2)
    r0.call("send", 10, peer=1, tag=1, complete=False)
    r1.call("recv", 20, peer=0, tag=2, complete=False)
    report = analyze(session([r0, r1]))
    assert report.verdict is Verdict.DEADLOCK
    assert "tags differ" in report.findings[0].message
    assert "same tag" in report.findings[0].hint


def test_a_wrong_tag_on_a_pending_isend_is_explained():
    # GIVEN a ring of three where each rank posts its isend to the next with tag 1, then
    # waits on an irecv from the previous with tag 0 (the direction tags swapped)
    builders = ranks(3)
    for b in builders:
        b.isend(14, peer=(b.rank + 1) % 3, tag=1)
        recv = b.irecv(16, peer=(b.rank - 1) % 3, tag=0)
        b.wait(recv, complete=False, line=18)
    report = analyze(session(builders))
    # THEN the deadlock names the tag of the peer's pending isend, not only the cycle
    assert report.verdict is Verdict.DEADLOCK
    assert (
        "tags differ: rank 0 recvs from rank 2 with tag 0, rank 2's pending isend to rank 0 "
        "(train.py:14) uses tag 1"
    ) in report.findings[0].message
    assert "same tag" in report.findings[0].hint
    assert "waited at line 18" in report.findings[0].message


def test_send_cycle_hints_fit_the_ranks_parity_and_irecv_cycles_their_order():
    # GIVEN a ring of three ordered by parity: ranks 0 and 2, both even, send to each other
    r0, r1, r2 = ranks(3)
    r0.call("send", 14, peer=2, complete=False)
    r2.call("send", 13, peer=0, complete=False)
    r1.call("recv", 19, peer=2, complete=False)
    hint = analyze(session([r0, r1, r2])).findings[0].hint
    # THEN the hint does not advise the parity order they already follow
    assert "ranks 0 and 2 are both even" in hint and "even ranks send first" not in hint
    # GIVEN ranks 0 and 1 (an even and an odd one) sending to each other: parity helps
    a, b = ranks(2)
    a.call("send", 5, peer=1, complete=False)
    b.call("send", 5, peer=0, complete=False)
    assert "let even ranks send first" in analyze(session([a, b])).findings[0].hint
    # GIVEN two ranks that wait on their irecvs before posting their isends
    a, b = ranks(2)
    for me in (a, b):
        me.wait(me.irecv(11, peer=1 - me.rank), complete=False, line=14)
    hint = analyze(session([a, b])).findings[0].hint
    # THEN the hint is to post the sends before waiting, not to use irecv
    assert hint.startswith("The receives are already irecv") and "isend" in hint


def test_a_wildcard_behind_a_send_send_pair_waits_on_the_pair_it_is_not_the_cycle():
    # GIVEN ranks 1 and 2 sending to each other first; rank 0 in a receive from any
    # rank, whose reply rank 3 waits for
    r0, r1, r2, r3 = ranks(4)
    r0.call("recv", 10, peer=None, complete=False)
    r1.call("send", 15, peer=2, complete=False)
    r2.call("send", 15, peer=1, complete=False)
    r3.call("recv", 20, peer=0, complete=False)
    report = analyze(session([r0, r1, r2, r3]))
    # THEN the cycle is the pair (0 <-> 3 is none: rank 1 or 2 could release rank 0)
    assert report.verdict is Verdict.DEADLOCK
    (found,) = [f for f in report.findings if f.kind is FindingKind.DEADLOCK]
    assert found.cycle == (1, 2) and found.ranks == (0, 1, 2, 3)
    assert "sends first" in found.hint


@pytest.mark.parametrize(
    "went_on", [("barrier", "barrier #0 on group 0"), ("recv", "recv from rank 1")]
)
def test_a_receive_whose_peer_went_on_one_send_short_is_explained(went_on):
    # GIVEN a pipeline where rank 0 sends two activations, skips the third (a no_grad
    # step) and enters the barrier, or its backward receive one microbatch early (a
    # recv/recv cycle after exchanges that met), while rank 1 waits in its third receive
    op, phrase = went_on
    r0, r1 = ranks(2)
    for _ in range(2):
        r0.call("send", 21, peer=1)
        r1.call("recv", 21, peer=0)
    r1.call("recv", 21, peer=0, complete=False)
    if op == "barrier":
        r0.call("barrier", 40, complete=False)
    else:
        r0.call("recv", 28, peer=1, complete=False)
    (found,) = analyze(session([r0, r1])).findings
    # THEN the counts say which side is short, and the hint points at the skipped send
    # (not "make one side send first")
    assert (
        "one send short: rank 0 issued 2 sends to rank 1, whose recv from rank 0 is its "
        f"number 3, and went on to {phrase}"
    ) in found.message
    assert found.hint.startswith("Rank 0 went on without the send its peer waits for")


def test_a_peer_that_has_sent_nothing_yet_is_not_said_to_have_skipped_its_send():
    # GIVEN a 3-cycle: rank 0 receives from rank 2 before its all_reduce on group 1
    # ({0, 1}); rank 1 is in that all_reduce (its send to rank 2 comes after it); rank 2
    # receives from rank 1 (its send to rank 0 comes after)
    r0, r1, r2 = ranks(3)
    for r in (r0, r1, r2):
        r.create_group("1", [0, 1])
    r0.call("recv", 19, peer=2, complete=False)
    r1.call("all_reduce", 22, gid="1", complete=False)
    r2.call("recv", 25, peer=1, complete=False)
    (found,) = analyze(session([r0, r1, r2])).findings
    # THEN the note states the order (rank 1 has sent nothing yet), not a skipped send
    assert found.cycle == (0, 2, 1)
    assert "one send short" not in found.message
    assert (
        "not sent yet: rank 1 has sent nothing to rank 2 and waits in all_reduce #0 on "
        "group 1 (train.py:22) first"
    ) in found.message
    assert not found.hint.startswith("Rank 1 went on without")


def test_a_send_and_a_receive_on_two_groups_are_named_with_their_groups():
    # GIVEN rank 0 sending to rank 1 on group 1 while rank 1 receives from rank 0 on
    # group 2 (both groups of ranks 0 and 1)
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.create_group("1", [0, 1])
        r.create_group("2", [0, 1])
    r0.call("send", 19, gid="1", peer=1, complete=False)
    r1.call("recv", 22, gid="2", peer=0, complete=False)
    (found,) = analyze(session([r0, r1])).findings
    # THEN the note and the hint say the groups differ
    assert (
        "groups differ: rank 0 sends to rank 1 on group 1, rank 1 receives from rank 0 on group 2"
    ) in found.message
    assert found.hint.startswith("A send meets only a receive on the same group")


def test_a_shift_whose_first_pair_differs_is_not_said_to_go_unnoticed():
    # GIVEN rank 0 issuing an all_reduce of 161 floats more at line 37 (#1), rank 1 going
    # on to its next all_reduce of 4 (line 19) there, then ending
    r0, r1 = ranks(2)
    for line, count in ((10, 4), (37, 161), (19, 4)):
        r0.call("all_reduce", line, count=count)
    for line, count in ((10, 4), (19, 4)):
        r1.call("all_reduce", line, count=count)
    report = analyze(session([r0.end(), r1.end()]))
    assert any("part earlier" in f.message for f in report.findings), report.findings
    # THEN no finding claims the backend paired them silently (161 and 4 differ)
    assert not any("did not notice" in f.message for f in report.findings), report.findings


def test_waits_orphaned_by_a_rank_that_failed_on_its_own_error_name_that_error():
    # GIVEN rank 0 left in DDP's parameter broadcast (from C++, at its construction line)
    # while rank 1's DDP constructor raised on a parameter of another size, and it ended
    r0, r1 = ranks(2)
    r0.call("broadcast", 29, root=0, count=160, api=None, complete=False)
    error = "RuntimeError: [1]: params[2] in this process with sizes [10, 16] appears not to match"
    r1.end(err=error, line=29)
    report = analyze(session([r0, r1], states={1: FAILED}))
    orphaned = next(f for f in report.findings if f.kind is FindingKind.ORPHANED_WAIT)
    # THEN the hint leads with that error, not with advice about where DDP is built
    assert orphaned.hint.startswith("Rank 1's program ended on an error of its own")
    assert "params[2]" in orphaned.hint and "DDP" not in orphaned.hint


def test_object_lists_of_different_lengths_are_named_so():
    # GIVEN broadcast_object_list with a list of 3 on rank 0 and of 2 on rank 1: its
    # first broadcast (one size per object) differs in count
    r0, r1 = ranks(2)
    for r, n, line in ((r0, 3, 18), (r1, 2, 20)):
        r.call(
            "broadcast", line, root=0, dtype="int64", count=n, api="broadcast_object_list",
            complete=False,
        )  # fmt: skip
    report = analyze(session([r0, r1]))
    mismatch = next(f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISMATCH)
    # THEN the hint is about the lists' lengths, not about a collective more or fewer
    assert mismatch.hint.startswith("broadcast_object_list needs an object_list of the same")


@pytest.mark.parametrize(
    "first, hint",
    [
        (("recv", 22, {"peer": 1}), "Every rank in the cycle receives first"),
        (
            ("all_reduce", 18, {"count": 16}),
            "Rank 1 never issued all_reduce #0 on group 0, which rank 0 waits in",
        ),
    ],
)
def test_a_first_receive_gets_no_send_short_note(first, hint):
    # GIVEN rank 1 in its first recv from rank 0, rank 0 in a receive of its own (a
    # recv/recv cycle of first receives) or in an all_reduce that rank 1 skipped (rank 0
    # sends after it)
    op, line, fields = first
    r0, r1 = ranks(2)
    r0.call(op, line, complete=False, **fields)
    r1.call("recv", 23, peer=0, complete=False)
    (found,) = analyze(session([r0, r1])).findings
    # THEN no note of a short count (no send was due yet), and the hint fits the case
    assert "short" not in found.message
    assert found.hint.startswith(hint)


def test_a_send_instead_of_a_collective_asks_the_waiting_rank_to_receive_first():
    # GIVEN rank 0 in a barrier that rank 1 never issued, rank 1 blocked in a send to
    # rank 0 (which rank 0 never receives)
    r0, r1 = ranks(2)
    r0.call("barrier", 22, complete=False)
    r1.call("send", 20, peer=0, complete=False)
    (found,) = analyze(session([r0, r1])).findings
    # THEN the hint has rank 0 receive (not send) before the barrier, and rank 1 waiting
    # in its send, not having gone past the barrier
    assert found.hint.startswith(
        "Rank 1 never issued barrier #0 on group 0, which rank 0 waits in (train.py:22), "
        "and waits in send to rank 0 instead"
    )
    assert "rank 0 meant to receive before it" in found.hint


def test_a_deadlock_in_one_groups_collectives_points_at_where_the_ranks_part():
    # GIVEN rank 0 past broadcast #0 (its root, which sends and goes on) and in
    # all_reduce #1, rank 1 in broadcast #0 with another root
    r0, r1 = ranks(2)
    r0.call("broadcast", 10, root=0, count=4)
    r0.call("all_reduce", 12, complete=False)
    r1.call("broadcast", 10, root=1, count=4, complete=False)
    # (built without the builders' agreement check: rank 0 resumed from a checkpoint
    # after its broadcast cannot know that #0's root differed, as a checkpoint keeps the
    # counts of collectives, not their arguments)
    deadlock = analyze(build_session([r0.trace(), r1.trace()], {})).findings[0]
    # THEN the hint points at #0, the earliest position a rank waits at, not rank 0's #1
    assert "(see the mismatch at #0 on group 0)" in deadlock.hint
    # GIVEN both in broadcast #0 with different roots: the same collective
    r0, r1 = ranks(2)
    r0.call("broadcast", 10, root=0, count=4, complete=False)
    r1.call("broadcast", 10, root=1, count=4, complete=False)
    deadlock = analyze(session([r0, r1])).findings[0]
    assert deadlock.hint.startswith(
        "The ranks wait in the same collective with arguments that do not agree (see the "
        "mismatch at #0 on group 0)"
    )


def test_different_calls_at_one_position_are_named_not_taken_for_a_shift():
    # GIVEN rank 0 logging with all_gather_object (its first all_gather: one int64 size
    # per rank) where rank 1 calls all_gather of a float tensor, after healthy steps
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.call("all_reduce", 12, count=4)
    r0.call("all_gather", 21, api="all_gather_object", dtype="int64", count=1, complete=False)
    r1.call("all_gather", 24, dtype="float32", count=8, complete=False)
    report = analyze(session([r0, r1]))
    mismatch = next(f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISMATCH)
    # THEN the hint names the two calls, and claims no collective more or fewer
    assert mismatch.hint.startswith(
        "The ranks make different calls at this position (all_gather on rank 1; "
        "all_gather_object on rank 0); an object collective issues collectives of its own"
    )
    assert "a collective more" not in mismatch.hint


def test_a_missing_collective_says_where_same_signature_collectives_shifted_apart():
    # GIVEN rank 2 issuing one all_reduce more (a debug hook at line 22, during the
    # forward at line 28) of the same signature as the gradient all_reduce (line 29):
    # the backend paired them one apart; ranks 0 and 1 ended after four
    hook = [("train.py", 22, "debug_act"), ("train.py", 28, "<module>")]
    builders = ranks(3)
    for step in range(4):
        for b in builders:
            if b.rank == 2 and step == 1:
                b.call("all_reduce", 22, count=4, stack=hook)
            b.call("all_reduce", 29, count=4)
    r0, r1, r2 = builders
    r2.call("all_reduce", 29, count=4, complete=False)
    report = analyze(session([r0.end(), r1.end(), r2], states={0: EXITED, 1: EXITED}))
    # THEN the missing collective says where the two sides parted
    missing = next(f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISSING)
    assert (
        "The two sides part earlier: rank 2's collective #1 (train.py:22) has no counterpart "
        "on ranks 0 and 1, whose #1 is at train.py:29"
    ) in missing.message
    # AND without such a shift (rank 2 simply ran one step more) it says nothing of it
    builders = ranks(3)
    for _ in range(4):
        for b in builders:
            b.call("all_reduce", 29, count=4)
    r0, r1, r2 = builders
    r2.call("all_reduce", 29, count=4, complete=False)
    report = analyze(session([r0.end(), r1.end(), r2], states={0: EXITED, 1: EXITED}))
    missing = next(f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISSING)
    assert "part earlier" not in missing.message


def test_a_missing_collective_names_each_line_the_ranks_that_issued_it_came_from():
    # GIVEN the root of a scatter (line 10) and the other receiver (line 14) in it, and
    # rank 1 ended before it
    r0, r1, r2 = ranks(3)
    r0.call("scatter", 10, count=4, complete=False)
    r2.call("scatter", 14, count=4, complete=False)
    report = analyze(session([r0, r1.end(), r2], states={1: EXITED}))
    # THEN the finding names both lines, each with its rank
    missing = next(f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISSING)
    assert "which rank 0 issued at train.py:10, rank 2 at train.py:14." in missing.message


def test_a_mismatch_names_where_two_paths_to_one_line_part_and_an_earlier_shift():
    # GIVEN one hook line (18) reached from two steps (28: the model's optimizer, 31: a
    # probe optimizer rank 0 alone has): rank 0's extra call at #1 pairs with rank 1's
    # second step, of the same signature; #2 differs in its count
    def hook(line: int) -> list[tuple[str, int, str]]:
        return [("train.py", 18, "average_params"), ("train.py", line, "<module>")]

    r0, r1 = ranks(2)
    for count, line in ((8, 28), (2, 31), (2, 28)):
        r0.call("all_reduce", 18, count=count, stack=hook(line))
    for count in (8, 2, 8):
        r1.call("all_reduce", 18, count=count, stack=hook(28))
    (mismatch,) = analyze(session([r0.end(), r1.end()])).findings
    # THEN the earlier shift is named: rank 0's #1, from line 31, has no counterpart
    assert "First divergence on group 0 at collective #2" in mismatch.message
    assert (
        "The two sides part earlier: rank 0's collective #1 (train.py:18, reached from "
        "train.py:31) has no counterpart on rank 1, whose #1 is at train.py:18, reached from "
        "train.py:28"
    ) in mismatch.message
    # AND at a divergence reached from two lines, each side says where its path parts
    r0, r1 = ranks(2)
    r0.call("all_reduce", 18, count=2, stack=hook(31))
    r1.call("all_reduce", 18, count=8, stack=hook(28))
    (mismatch,) = analyze(session([r0.end(), r1.end()])).findings
    assert "rank 0 calls all_reduce (float32[2]) at train.py:18, reached from train.py:31" in (
        mismatch.message
    )


def test_a_cycle_through_a_wildcard_a_rank_that_exited_should_have_met_says_so():
    # GIVEN a master waiting for any worker's result, worker 1 exited without sending
    # it, workers 2 and 3 waiting for the master's next task
    r0, r1, r2, r3 = ranks(4)
    r0.call("recv", 14, peer=None, complete=False)
    r2.call("recv", 23, peer=0, complete=False)
    r3.call("recv", 23, peer=0, complete=False)
    report = analyze(session([r0, r1.end(), r2, r3], states={1: EXITED}))
    deadlock = next(f for f in report.findings if f.kind is FindingKind.DEADLOCK)
    # THEN the hint names the rank that ended, not "every rank receives first"
    assert deadlock.hint.startswith(
        "The receive from any rank on the cycle was to be met by rank 1"
    )
    assert FindingKind.ORPHANED_WAIT in kinds(report)


def test_a_ddp_bucket_all_reduce_of_another_dtype_points_at_a_comm_hook():
    # GIVEN DDP's bucket all_reduce, issued from C++ during backward on rank 0 (no API
    # function) and by an fp16 compression hook (through dist.all_reduce) on rank 1
    r0, r1 = ranks(2)
    r0.call("all_reduce", 22, api=None, dtype="float32", count=90, redop="sum")
    r1.call("all_reduce", 22, dtype="float16", count=90, redop="sum")
    (mismatch,) = analyze(session([r0.end(), r1.end()])).findings
    # THEN the hint is about the hook registered on some ranks, not a cast in user code
    assert mismatch.hint.startswith("DDP's gradient bucket all_reduce")
    assert "comm hook" in mismatch.hint
    # AND a rank in its own all_reduce at another line (it ran no backward: no data)
    # gets the hint for ranks in different calls
    r0, r1 = ranks(2)
    r0.call("all_reduce", 32, api=None, dtype="float32", count=90, redop="sum")
    r1.call("all_reduce", 35, dtype="float32", count=1, redop="sum")
    (mismatch,) = analyze(session([r0.end(), r1.end()])).findings
    assert "different lines of the program" in mismatch.hint


def test_a_receive_from_the_wrong_parent_names_the_rank_that_sends_to_it():
    # GIVEN a tree broadcast where rank 3 receives from rank 2 (its parent is rank 1),
    # rank 1 blocks sending to rank 3 and ranks 0 and 2 wait in the barrier
    r0, r1, r2, r3 = ranks(4)
    r0.call("send", 19, peer=1)
    r1.call("recv", 15, peer=0)
    r0.call("send", 19, peer=2)
    r2.call("recv", 15, peer=0)
    r1.call("send", 19, peer=3, complete=False)
    r3.call("recv", 15, peer=2, complete=False)
    r0.call("barrier", 22, complete=False)
    r2.call("barrier", 22, complete=False)
    found = analyze(session([r0, r1, r2, r3])).findings[0]
    # THEN the sender that waits on rank 3 is named, not "rank 2 went on without a send"
    assert (
        "wrong peer: rank 1 is blocked sending to rank 3 (train.py:19), which receives from "
        "rank 2, and rank 2 went on to barrier #0 on group 0"
    ) in found.message
    assert found.hint.startswith("Each send must meet its receive")


def test_a_receive_from_any_rank_under_a_tag_no_blocked_sender_uses_is_explained():
    # GIVEN rank 0 receiving from any rank with tag 7 while ranks 1 and 2 are blocked
    # sending to it with tag 8
    r0, r1, r2 = ranks(3)
    r0.call("recv", 10, peer=None, tag=7, complete=False)
    for r in (r1, r2):
        r.call("send", 20, peer=0, tag=8, complete=False)
    found = analyze(session([r0, r1, r2])).findings[0]
    assert "tags differ: rank 0 receives from any rank with tag 7, rank 1 is blocked" in (
        found.message
    )
    assert "same tag" in found.hint


def test_many_independent_deadlocks_index_the_blocked_senders_once(monkeypatch):
    from dl2.analysis import deadlock

    # GIVEN 64 independent send/send pairs (a part of the deadlock set each)
    builders = ranks(128)
    for b in builders:
        b.call("send", 10, peer=b.rank ^ 1, complete=False)
    traces = session(builders)
    built = []
    index = deadlock._blocked_senders
    monkeypatch.setattr(deadlock, "_blocked_senders", lambda wfg: built.append(1) or index(wfg))
    report = analyze(traces)
    # THEN each pair is a finding, and the waiting ranks' sends were indexed once, not
    # once per part (8,192 ranks in 4,096 pairs took 67 s that way)
    assert len([f for f in report.findings if f.kind is FindingKind.DEADLOCK]) == 64
    assert len(built) == 1


def test_wildcard_recv_waits_on_any_sender_or_semantics():
    # GIVEN rank 0 in recv(src=None) and rank 1 still running: no deadlock
    r0, r1, r2 = ranks(3)
    r0.call("recv", 10, peer=None, complete=False)
    r2.call("recv", 30, peer=0, complete=False)
    report = analyze(session([r0, r1, r2]))
    assert report.verdict is Verdict.OK
    # WHEN rank 1 exits instead, nobody can send to rank 0 any more
    report = analyze(session([r0, r1.end(), r2]))
    assert report.verdict is Verdict.DEADLOCK
    state = next(s for s in report.ranks if s.rank == 0)
    assert state.any_of and state.waits_on == (1, 2)


def test_collective_order_mismatch_first_divergence():
    r0, r1 = ranks(2)
    r0.call("all_reduce", 10, redop="sum", complete=False)
    r1.call("broadcast", 20, root=0, complete=False)
    report = analyze(session([r0, r1]))
    assert report.verdict is Verdict.DEADLOCK
    mismatch = next(f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISMATCH)
    assert "collective #0" in mismatch.message
    assert {(o.rank, o.line) for o in mismatch.ops} == {(0, 10), (1, 20)}


def test_a_mismatch_in_one_shared_helper_reached_from_two_call_sites_is_a_shifted_one():
    # GIVEN both ranks' all_reduce at one helper line, reached from two call sites
    helper = ("mylib/comm.py", 6, "all_reduce_sum")
    r0, r1 = ranks(2)
    r0.call("all_reduce", 6, count=2, stack=[helper, ("train.py", 31, "<module>")])
    r1.call("all_reduce", 6, count=6, stack=[helper, ("train.py", 19, "train_step")])
    report = analyze(session([r0.end(), r1.end()]))
    # THEN the hint is the one for ranks at different calls, not "pad to the same size"
    (mismatch,) = report.findings
    assert "different lines of the program" in mismatch.hint and "pad" not in mismatch.hint
    # AND at one call site (a loop over tensors) it is the one for one call
    r0, r1 = ranks(2)
    r0.call("all_reduce", 6, count=2, stack=[helper, ("train.py", 19, "train_step")])
    r1.call("all_reduce", 6, count=6, stack=[helper, ("train.py", 19, "train_step")])
    (mismatch,) = analyze(session([r0.end(), r1.end()])).findings
    assert "pad" in mismatch.hint


@pytest.mark.parametrize(
    ("field", "a", "b"),
    [("redop", "sum", "max"), ("dtype", "float32", "int32"), ("root", 0, 1), ("count", 4, 8)],
)
def test_completed_signature_mismatch_is_a_defect(field, a, b):
    # GIVEN a collective gloo completed although the ranks disagree on one field
    r0, r1 = ranks(2)
    op = "broadcast" if field == "root" else "all_reduce"
    r0.call(op, 10, **{field: a})
    r1.call(op, 20, **{field: b})
    report = analyze(session([r0.end(), r1.end()]))
    assert report.verdict is Verdict.DEFECT
    assert kinds(report) == [FindingKind.COLLECTIVE_MISMATCH]
    assert field in report.findings[0].message


@pytest.mark.parametrize(
    "op",
    [
        "gather",
        "scatter",
        "all_gather_coalesced",
        "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced",
    ],
)
@pytest.mark.parametrize(
    ("count0", "count1", "verdict"), [(4, 3, Verdict.DEFECT), (4, 4, Verdict.OK)]
)
def test_every_sized_collective_compares_counts(op, count0, count1, verdict):
    # GIVEN a gather (each rank's contribution), a scatter (each rank's share) or a
    # coalesced call (its tensors' sum) that gloo completed with or without equal counts
    r0, r1 = ranks(2)
    root = {"root": 0} if op in ("gather", "scatter") else {}
    r0.call(op, 10, count=count0, **root)
    r1.call(op, 20, count=count1, **root)
    report = analyze(session([r0.end(), r1.end()]))
    # THEN only unequal counts are a mismatch
    assert report.verdict is verdict
    if verdict is Verdict.DEFECT:
        assert kinds(report) == [FindingKind.COLLECTIVE_MISMATCH]
        assert "count" in report.findings[0].message


@pytest.mark.parametrize(
    ("splits0", "splits1", "verdict"),
    [
        ([[1, 3], [1, 3]], [[2, 2], [2, 2]], Verdict.DEFECT),  # equal totals, no pairing
        ([[1, 3], [1, 2]], [[2, 2], [3, 2]], Verdict.OK),  # uneven but consistent
    ],
)
def test_all_to_all_split_sizes_must_pair_up(splits0, splits1, verdict):
    # GIVEN an all_to_all_single whose counts agree but whose split sizes may not pair up
    r0, r1 = ranks(2)
    r0.call("all_to_all_single", 10, count=4, splits=splits0)
    r1.call("all_to_all_single", 20, count=4, splits=splits1)
    report = analyze(session([r0.end(), r1.end()]))
    # THEN only a pairing that breaks (rank 0 sends 3 to rank 1, which expects 2) is a defect
    assert report.verdict is verdict
    if verdict is Verdict.DEFECT:
        assert kinds(report) == [FindingKind.COLLECTIVE_MISMATCH]
        assert "split_sizes" in report.findings[0].message
        assert "sending [1, 3]" in report.findings[0].message


@pytest.mark.parametrize(
    ("a", "b", "verdict"),
    [
        ("all_gather", "all_gather_into_tensor", Verdict.OK),
        # gloo aborts on this pair ("Received data size doesn't match"), measured
        ("reduce_scatter", "reduce_scatter_tensor", Verdict.DEFECT),
    ],
)
def test_the_list_and_the_flat_form_of_a_collective_match(a, b, verdict):
    # GIVEN one rank gathering into a list of tensors, the other into one flat tensor
    r0, r1 = ranks(2)
    r0.call(a, 10)
    r1.call(b, 20)
    # THEN all_gather's two forms are one collective on gloo and NCCL alike;
    # reduce_scatter's are not on gloo
    assert analyze(session([r0.end(), r1.end()])).verdict is verdict


@pytest.mark.parametrize(("other", "verdict"), [([2, 3], Verdict.OK), ([3, 2], Verdict.DEADLOCK)])
def test_list_reduce_scatter_shards_must_have_the_same_sizes_on_every_rank(other, verdict):
    # GIVEN a list reduce_scatter of 5 elements on both ranks, cut [2, 3] on rank 0
    r0, r1 = ranks(2)
    r0.call("reduce_scatter", 15, count=5, splits=[[2, 3]], complete=False)
    r1.call("reduce_scatter", 15, count=5, splits=[other], complete=False)
    report = analyze(session([r0, r1]))
    # THEN the same total cut otherwise is a mismatch (gloo hangs on it)
    if verdict is Verdict.OK:
        assert FindingKind.COLLECTIVE_MISMATCH not in kinds(report)
    else:
        assert report.verdict is verdict
        mismatch = next(f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISMATCH)
        assert "splits differ" in mismatch.message and "shards" in mismatch.hint


def test_a_wildcard_recv_a_rank_died_in_is_matched_with_the_send_that_completed():
    # GIVEN rank 0 died (gloo's size check aborts) inside a recv from any rank of 4
    # floats; rank 2's send of 8 floats to it completed, rank 1's send of 4 did not
    r0, r1, r2 = ranks(3)
    r0.call("recv", 19, peer=None, count=4, complete=False)
    r1.call("send", 27, peer=0, count=4, complete=False)
    r2.call("send", 27, peer=0, count=8)
    r2.call("barrier", 28, complete=False)
    from dl2.trace.session import build_session

    # (built without the resume checks: a trace resumed past the send no longer shows it)
    built = build_session([r.trace() for r in (r0, r1, r2)], {0: FAILED})
    report = analyze(built)
    # THEN the size mismatch of that pair is the finding (not an "early exit")
    mismatch = next(f for f in report.findings if f.kind is FindingKind.P2P_MISMATCH)
    assert {(o.rank, o.line) for o in mismatch.ops} == {(0, 19), (2, 27)}
    assert "count differs" in mismatch.message
    assert report.verdict is Verdict.DEFECT


def test_identical_collectives_from_different_call_sites_are_clean():
    r0, r1 = ranks(2)
    r0.call("all_reduce", 10, redop="sum", function="a")
    r1.call("all_reduce", 99, redop="sum", function="b")
    assert analyze(session([r0.end(), r1.end()])).verdict is Verdict.OK


@pytest.mark.parametrize("peer", [NO_RANK, 2])
def test_a_peer_that_is_no_rank_is_named_and_never_matched(peer):
    # GIVEN rank 0 receives from a rank that does not exist (the recorder writes NO_RANK
    # for a negative or too large group rank; 2 in a world of 2 is past it too), rank 1
    # sends to rank 0
    r0, r1 = ranks(2)
    r0.call("recv", 16, peer=peer, complete=False)
    r1.call("send", 20, peer=0, complete=False)
    report = analyze(session([r0, r1]))
    # THEN a deadlock (nothing can release rank 0) that says why, with the fix
    assert report.verdict is Verdict.DEADLOCK
    (finding,) = [f for f in report.findings if f.kind is FindingKind.DEADLOCK]
    assert finding.ranks == (0, 1)
    assert "rank 0 recvs from a rank that is not in group 0" in finding.message
    assert "modulo" in finding.hint
    assert "exited" not in finding.message


def test_a_rank_with_another_live_thread_is_never_proven_stuck():
    # GIVEN a send/send cycle, but rank 0 has a thread of the user's code alive besides
    # the blocked one (it may still post the recv that releases rank 1)
    r0, r1 = ranks(2)
    r0.threads(1)
    r0.call("send", 10, peer=1, complete=False)
    r1.call("send", 20, peer=0, complete=False)
    report = analyze(session([r0, r1]))
    # THEN no deadlock is proven
    assert report.verdict is not Verdict.DEADLOCK
    assert not any(f.kind is FindingKind.DEADLOCK for f in report.findings)
    # AND once that thread has ended, the same cycle is one
    r0.threads(0)
    assert analyze(session([r0, r1])).verdict is Verdict.DEADLOCK


def test_two_independent_deadlocks_are_two_findings():
    # GIVEN send/send cycles between ranks 0 and 1 and between ranks 2 and 3
    rs = ranks(4)
    for r in rs:
        r.call("send", 10 + r.rank, peer=r.rank ^ 1, complete=False)
    report = analyze(session(rs))
    # THEN each cycle is a finding of its own, neither said to wait on the other
    deadlocks = [f for f in report.findings if f.kind is FindingKind.DEADLOCK]
    assert [(f.ranks, f.cycle) for f in deadlocks] == [((0, 1), (0, 1)), ((2, 3), (2, 3))]
    assert not any("too" in f.message for f in deadlocks)


def test_a_call_rejected_on_its_own_rank_is_named_when_nothing_else_explains_the_failure():
    # GIVEN both ranks' send/recv raised at once (a negative tag) and both processes failed
    r0, r1 = ranks(2)
    r0.ret(
        r0.issue("send", 11, peer=1, tag=-1, returned=False),
        "RuntimeError: Tag must be nonnegative",
    )
    r1.ret(
        r1.issue("recv", 13, peer=0, tag=-1, returned=False),
        "RuntimeError: Tag must be nonnegative",
    )
    report = analyze(session([r0, r1], states={0: FAILED, 1: FAILED}))
    # THEN each call is a failed-call finding with its line: a defect, not "a reason other
    # than communication"
    assert report.verdict is Verdict.DEFECT
    calls = [f for f in report.findings if f.kind is FindingKind.FAILED_CALL]
    assert [(f.ranks, f.ops[0].line) for f in calls] == [((0,), 11), ((1,), 13)]
    assert "Tag must be nonnegative" in calls[0].message


def test_a_call_that_failed_because_its_peer_left_is_no_failed_call():
    r0, r1 = ranks(2)
    r0.ret(r0.issue("recv", 13, peer=1, returned=False), "RuntimeError: Connection closed by peer")
    report = analyze(session([r0, r1], states={0: FAILED, 1: FAILED}))
    assert not any(f.kind is FindingKind.FAILED_CALL for f in report.findings)


def test_a_call_that_timed_out_waiting_on_a_slow_rank_is_a_hang_naming_that_rank():
    # GIVEN rank 0's all_reduce #1 raised on the group's 5 s timeout while rank 1, alive,
    # was running Python code at line 18 (its watchdog's last state)
    r0, r1 = ranks(2)
    r0.call("all_reduce", 16)
    timed_out = "RuntimeError: Timed out waiting 5000ms for recv operation to complete"
    r0.wait(r0.issue("all_reduce", 19), err=timed_out)
    r1.call("all_reduce", 16)
    r1.state([], "python", [("train.py", 18, "main")])
    report = analyze(session([r0, r1], states={0: FAILED, 1: ALIVE}))
    # THEN it hung: the timeout ended it, on rank 1, which never issued the all_reduce
    assert report.verdict is Verdict.HANG, report.findings
    hang = next(f for f in report.findings if f.kind is FindingKind.HANG)
    assert hang.ranks == (0, 1) and [o.line for o in hang.ops] == [19]
    assert "timed out waiting on rank 1 (running Python code at train.py:18 in main)" in (
        hang.message
    )
    assert "Timed out waiting 5000ms" in hang.message
    assert not any(f.kind is FindingKind.FAILED_CALL for f in report.findings)


@pytest.mark.parametrize("rank1", [EXITED, FAILED])
def test_a_call_that_timed_out_on_a_rank_that_came_late_is_a_hang_naming_that_rank(rank1):
    # GIVEN rank 0's all_reduce raised on the group's timeout and the program went on;
    # rank 1, slow, issued the all_reduce later, and it failed on the connection rank 0
    # had closed (both caught it and exited, or rank 1 let it fail the job)
    r0, r1 = ranks(2)
    timed_out = "RuntimeError: Timed out waiting 3000ms for recv operation to complete"
    closed = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:3998"
    r0.wait(r0.issue("all_reduce", 23), err=timed_out)
    r1.wait(r1.issue("all_reduce", 23), err=closed)
    for r in (r0, r1):
        r.end("exit")
    report = analyze(session([r0, r1], states={0: EXITED, 1: rank1}))
    # THEN it is no "ok" and no failure of unknown cause: a hang on rank 1, which came late
    assert report.verdict is Verdict.HANG, report.findings
    hang = next(f for f in report.findings if f.kind is FindingKind.HANG)
    assert hang.ranks == (0, 1)
    assert "timed out waiting on rank 1, which issued the matching call only after" in (
        hang.message
    )


def test_a_lazy_connect_refused_by_an_exited_peer_is_no_timeout():
    # GIVEN rank 1's first all_reduce on a lazily connected group failing with gloo's
    # "timed out connecting: ... Connection refused": rank 0 had left with os._exit(0)
    # (no end record, no failed op)
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.create_group("1", [0, 1])
        r.call("barrier", 15)
    refused = "RuntimeError: [pair.cc:152] timed out connecting: SO_ERROR: Connection refused"
    r1.wait(r1.issue("all_reduce", 24, gid="1"), err=refused)
    report = analyze(session([r0, r1], states={0: EXITED, 1: FAILED}))
    # THEN rank 1 waited on a rank that was gone: not a hang "needing a longer timeout"
    assert not any(f.kind is FindingKind.HANG for f in report.findings), report.findings
    assert FindingKind.ORPHANED_WAIT in kinds(report)


def test_a_store_wait_that_timed_out_on_a_slow_setter_is_a_hang_naming_it():
    # GIVEN rank 0's store.wait(["ckpt"], 3 s) raised on its timeout while rank 1 was
    # still running Python code (a slow checkpoint) before setting the key
    r0, r1 = ranks(2)
    r0.store("wait", 19, ["ckpt"], timeout=3.0, err="DistStoreError: wait timeout after 3000ms")
    r1.state([], "python", [("train.py", 22, "save")])
    report = analyze(session([r0, r1], states={0: FAILED, 1: ALIVE}))
    # THEN the timed-out wait is a hang on rank 1, at the line it was running
    assert report.verdict is Verdict.HANG, report.findings
    hang = next(f for f in report.findings if f.kind is FindingKind.HANG)
    assert [o.line for o in hang.ops] == [19]
    assert "rank 1 (running Python code at train.py:22 in save)" in hang.message


def test_a_deadlock_that_the_timeouts_broke_is_still_a_deadlock():
    # GIVEN recv/recv: both ranks' recvs raised on the group's timeout, and they exited
    r0, r1 = ranks(2)
    timed_out = "RuntimeError: Timed out waiting 6000ms for recv operation to complete"
    r0.wait(r0.issue("recv", 17, peer=1), err=timed_out)
    r1.wait(r1.issue("recv", 19, peer=0), err=timed_out)
    for r, line in ((r0, 17), (r1, 19)):
        r.end(err=timed_out, line=line)
    report = analyze(session([r0, r1], states={0: FAILED, 1: FAILED}))
    # THEN the cycle is named, not two waits each orphaned by the other's failure
    assert report.verdict is Verdict.DEADLOCK, report.findings
    deadlock = report.findings[0]
    assert deadlock.kind is FindingKind.DEADLOCK and deadlock.cycle == (0, 1)
    assert sorted((o.rank, o.line) for o in deadlock.ops) == [(0, 17), (1, 19)]
    assert "until their timeouts ended the job" in deadlock.message
    assert FindingKind.ORPHANED_WAIT not in kinds(report)


CLOSED = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:4242"


@pytest.mark.parametrize("ending", ["kill", "one-timeout"])
def test_a_deadlock_a_kill_or_one_sides_timeout_broke_is_still_a_deadlock(ending):
    # GIVEN send/send, ended either by a SIGKILL of rank 0 inside its send (rank 1's
    # send then fails on the closed connection), or by rank 0's send raising on its own
    # short timeout and exiting (rank 1's then fails the same way)
    r0, r1 = ranks(2)
    if ending == "kill":
        r0.call("send", 16, peer=1, complete=False)
        states = {0: KILLED, 1: FAILED}
    else:
        timed_out = "RuntimeError: Timed out waiting 4000ms for send operation to complete"
        r0.wait(r0.issue("send", 16, peer=1), err=timed_out)
        r0.end(err=timed_out, line=16)
        states = {0: FAILED, 1: FAILED}
    r1.wait(r1.issue("send", 18, peer=0), err=CLOSED)
    r1.end(err=CLOSED, line=18)
    report = analyze(session([r0, r1], states=states))
    # THEN the cycle they sat in is named, not the ending's consequences
    assert report.verdict is Verdict.DEADLOCK, report.findings
    deadlock = report.findings[0]
    assert deadlock.kind is FindingKind.DEADLOCK and deadlock.cycle == (0, 1)
    assert sorted((o.rank, o.line) for o in deadlock.ops) == [(0, 16), (1, 18)]
    assert "until the job's end broke the cycle" in deadlock.message
    assert ("rank 0 killed by a signal" in deadlock.message) is (ending == "kill")
    assert FindingKind.ORPHANED_WAIT not in kinds(report)


def test_a_deadlock_broken_by_a_rank_ending_from_another_thread_is_still_a_deadlock():
    # GIVEN rank 1 blocked in a recv from rank 0, rank 0 in a barrier; rank 1's watchdog
    # thread then called os._exit(3): no end record, its main thread still in the recv;
    # rank 0's barrier failed on the closed connection
    r0, r1 = ranks(2)
    r0.call("barrier", 31)  # both passed the first barrier
    r1.call("barrier", 27)
    r1.call("recv", 29, peer=0, complete=False)
    r0.wait(r0.issue("barrier", 31), err=CLOSED)
    r0.end(err=CLOSED, line=31)
    report = analyze(session([r0, r1], states={0: FAILED, 1: FAILED}))
    # THEN the cycle the exit broke is named (not "rank 1 ended before barrier #1")
    assert report.verdict is Verdict.DEADLOCK, report.findings
    deadlock = report.findings[0]
    assert deadlock.cycle == (0, 1)
    assert sorted((o.rank, o.line) for o in deadlock.ops) == [(0, 31), (1, 29)]
    assert "rank 1 ended inside its call" in deadlock.message


def test_a_wait_orphaned_by_a_rank_killed_outside_communication_stays_orphaned():
    # GIVEN rank 1 killed while in its own code; rank 0's recv then failed
    r0, r1 = ranks(2)
    r0.wait(r0.issue("recv", 10, peer=1), err=CLOSED)
    r1.call("all_reduce", 20, gid="0", count=1, complete=True)
    report = analyze(session([r0, r1], states={0: FAILED, 1: KILLED}))
    # THEN no deadlock: rank 1 waited on nothing
    assert FindingKind.DEADLOCK not in kinds(report), report.findings


def test_a_timeout_on_a_rank_its_launcher_ended_afterwards_is_a_hang():
    # GIVEN mp.spawn: ranks 0 and 2 raised on their timeout in all_reduce #1 while rank 1
    # ran its own code; mp.spawn then ended rank 1 (no end record, no error of its own)
    r0, r1, r2 = ranks(3)
    timed_out = "RuntimeError: Timed out waiting 5000ms for recv operation to complete"
    for r in (r0, r1, r2):
        r.call("all_reduce", 12, count=4)
    r1.state([], "python", [("train.py", 11, "spin")])  # its watchdog's last word
    for r in (r0, r2):
        r.wait(r.issue("all_reduce", 13, count=4), err=timed_out)
        r.end(err=timed_out, line=13)
    report = analyze(session([r0, r1, r2], states={0: FAILED, 1: FAILED, 2: FAILED}))
    # THEN the job hung on rank 1 until the timeout: not a rank 1 that left early
    assert report.verdict is Verdict.HANG, report.findings
    hang = report.findings[0]
    assert hang.kind is FindingKind.HANG
    assert "timed out waiting on rank 1 (running Python code at train.py:11" in hang.message
    assert FindingKind.ORPHANED_WAIT not in kinds(report)


def test_a_call_that_timed_out_after_its_peer_issued_it_too_is_no_hang():
    # GIVEN both ranks issued the all_reduce; rank 0's raised on its timeout anyway
    r0, r1 = ranks(2)
    r0.wait(r0.issue("all_reduce", 19), err="RuntimeError: Timed out waiting 5000ms")
    r1.call("all_reduce", 19, complete=False)
    report = analyze(session([r0, r1], states={0: FAILED, 1: ALIVE}))
    # THEN nothing says rank 1 never issued it
    assert not any(f.kind is FindingKind.HANG for f in report.findings), report.findings


def test_rank_exiting_early_orphans_the_waiter():
    r0, r1 = ranks(2)
    r0.call("recv", 10, peer=1, complete=False)
    r1.end()
    report = analyze(session([r0, r1]))
    # gloo fails such ops ("Connection closed by peer") instead of hanging: a defect
    assert report.verdict is Verdict.DEFECT
    orphan = next(f for f in report.findings if f.kind is FindingKind.ORPHANED_WAIT)
    assert orphan.ranks == (0, 1)
    assert orphan.ops[0].line == 10


def test_op_failed_because_peer_exited_is_an_orphan_defect():
    # GIVEN rank 0's all_reduce raised once rank 1 had exited without issuing it
    r0, r1 = ranks(2)
    op_id = r0.issue("all_reduce", 25)
    r0.wait(op_id, err="Connection closed by peer")
    report = analyze(session([r0, r1.end()], states={0: FAILED, 1: EXITED}))
    assert report.verdict is Verdict.DEFECT
    orphan = next(f for f in report.findings if f.kind is FindingKind.ORPHANED_WAIT)
    assert orphan.ranks == (0, 1)
    assert orphan.ops[0].line == 25
    assert "Connection closed" in orphan.message


def test_an_uncaught_exception_that_ended_a_peer_is_named_with_its_line():
    # GIVEN rank 1's program raised at line 6 (its end record says so) and rank 0's
    # all_reduce then failed ("Connection closed"), raising out of line 25
    r0, r1 = ranks(2)
    op_id = r0.issue("all_reduce", 25)
    r0.wait(op_id, err="RuntimeError: Connection closed by peer")
    r0.end(err="RuntimeError: Connection closed by peer", line=25)
    r1.end(err="ValueError: shard 1 is corrupt", line=6)
    report = analyze(session([r0, r1], states={0: FAILED, 1: FAILED}))
    assert report.verdict is Verdict.DEFECT
    # THEN the orphan and the missing collective name rank 1's exception and its line
    cause = "ValueError: shard 1 is corrupt, raised at train.py:6 in load"
    orphan = next(f for f in report.findings if f.kind is FindingKind.ORPHANED_WAIT)
    assert cause in orphan.message
    missing = next(f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISSING)
    assert f"Its program ended with an uncaught {cause}." in missing.message
    # and the warnings say it once, without the "failed at interpreter exit" guess
    assert f"rank 1's program ended with an uncaught {cause}" in report.warnings
    assert not any("interpreter exit" in w for w in report.warnings)
    assert not any(w.startswith("rank 0's program") for w in report.warnings)  # its op's error


def test_collective_failed_inside_backward_after_peer_exited_is_a_defect():
    # GIVEN rank 0 failed inside an all_reduce (no ret: it raised in C++) that rank 1,
    # which exited cleanly, never issued
    r0, r1 = ranks(2)
    r0.call("all_reduce", 8)
    r0.call("all_reduce", 25, complete=False)
    r1.call("all_reduce", 8)
    report = analyze(session([r0, r1.end()], states={0: FAILED, 1: EXITED}))
    # THEN the rank that left caused it: a defect, not an unrelated job failure
    assert report.verdict is Verdict.DEFECT


def test_a_rank_that_crashes_in_teardown_after_its_program_ended_has_still_left():
    # GIVEN rank 1 skipped the last all_reduce and exited: its exit hook wrote `end`,
    # then its process died in interpreter teardown (SIGABRT, seen now and then on gloo),
    # and rank 0's all_reduce failed when the connection closed
    r0, r1 = ranks(2)
    r0.call("all_reduce", 8)
    op_id = r0.issue("all_reduce", 25)
    r0.wait(op_id, err="Connection closed by peer")
    r1.call("all_reduce", 8)
    report = analyze(session([r0, r1.end()], states={0: FAILED, 1: FAILED}))
    # THEN the verdict is the communication defect, as when rank 1 exits with status 0
    assert report.verdict is Verdict.DEFECT
    orphan = next(f for f in report.findings if f.kind is FindingKind.ORPHANED_WAIT)
    assert orphan.ranks == (0, 1)
    assert orphan.ops[0].line == 25
    assert any("rank 1 failed at interpreter exit" in w for w in report.warnings)
    # AND a rank that failed without ending its program is still a job failure
    r0, r1 = ranks(2)
    r0.call("all_reduce", 8)
    op_id = r0.issue("all_reduce", 25)
    r0.wait(op_id, err="Connection closed by peer")
    r1.call("all_reduce", 8)
    report = analyze(session([r0, r1], states={0: FAILED, 1: FAILED}))
    assert report.verdict is Verdict.JOB_FAILED


def test_a_peer_that_aborted_on_a_mismatch_did_not_orphan_the_wait():
    # GIVEN a coalesced all_reduce of 8 elements on rank 0 and 12 on rank 1: gloo aborted
    # rank 0 (size enforce), and rank 1's op then failed ("Connection reset by peer")
    r0, r1 = ranks(2)
    r0.call("all_reduce_coalesced", 23, count=8, complete=False)
    op_id = r1.issue("all_reduce_coalesced", 23, count=12)
    r1.wait(op_id, err="Connection reset by peer")
    report = analyze(session([r0, r1], states={0: FAILED, 1: FAILED}))
    # THEN the mismatch is the one finding: rank 0 did not "leave", it failed on it
    assert report.verdict is Verdict.DEFECT
    assert kinds(report) == [FindingKind.COLLECTIVE_MISMATCH]
    assert report.findings[0].ranks == (0, 1)
    assert {op.line for op in report.findings[0].ops} == {23}


def test_waiting_on_a_crashed_rank_is_a_job_failure():
    r0, r1 = ranks(2)
    r0.call("all_reduce", 10, complete=False)
    report = analyze(session([r0, r1], states={1: FAILED}))
    assert report.verdict is Verdict.JOB_FAILED
    assert FindingKind.ORPHANED_WAIT in kinds(report)


def test_crossed_groups_deadlock():
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.create_group("1", [0, 1])
        r.create_group("2", [0, 1])
    r0.call("all_reduce", 10, gid="1", complete=False)
    r1.call("all_reduce", 20, gid="2", complete=False)
    report = analyze(session([r0, r1]))
    assert report.verdict is Verdict.DEADLOCK
    hint = report.findings[0].hint
    assert hint.startswith(
        "Rank 0 waits in all_reduce #0 on group 1, which rank 1 has not issued: it issued 0 "
        "on group 1 and went on to all_reduce #0 on group 2. Either the ranks issue the "
        "groups' collectives in different orders"
    )


def test_a_collective_one_rank_skipped_on_a_subgroup_is_named_with_the_counts():
    # GIVEN a pair group where rank 1 skips one of the pair's all_reduces (a no_grad
    # step), then both ranks go on to a world barrier
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.create_group("2", [0, 1])
    for step in range(4):
        r0.call("all_reduce", 22, gid="2", complete=step < 3)
        if step != 1:
            r1.call("all_reduce", 22, gid="2")
    r1.call("barrier", 39, complete=False)
    report = analyze(session([r0, r1]))
    # THEN the hint says which rank has not reached which collective, with its count
    assert report.verdict is Verdict.DEADLOCK
    assert report.findings[0].hint.startswith(
        "Rank 0 waits in all_reduce #3 on group 2, which rank 1 has not issued: it issued 3 "
        "on group 2 and went on to barrier #0 on group 0. Either it skipped one"
    )


def test_new_group_by_a_subset_blocks_in_creation():
    r0, r1 = ranks(2)
    r0.newgroup([0, 1], "1", stack=[["t.py", 5, "m"]])
    r0.create_group("1", [0, 1], line=5, complete=False)
    r1.call("barrier", 9, complete=False)
    report = analyze(session([r0, r1]))
    assert report.verdict is Verdict.DEADLOCK
    assert report.findings[0].cycle == (0, 1)
    assert any(f.kind is FindingKind.GROUP_MISMATCH for f in report.findings)


def test_ranks_that_computed_other_members_at_one_line_are_named_so():
    # GIVEN ranks 0 and 1 call new_group([0, 1, 2]) where rank 2, at the same line,
    # calls new_group([0, 1]) (each decided the members from its own data)
    r0, r1, r2 = ranks(3)
    for r in (r0, r1):
        r.newgroup([0, 1, 2], "1", stack=[["t.py", 13, "main"]])
        r.create_group("1", [0, 1, 2], line=13, complete=False)
    r2.newgroup([0, 1], None, stack=[["t.py", 13, "main"]])  # not a member of its own
    r2.call("barrier", 17, complete=False)
    report = analyze(session([r0, r1, r2]))
    # THEN the group mismatch says what rank 2 called there instead
    (mismatch,) = [f for f in report.findings if f.kind is FindingKind.GROUP_MISMATCH]
    assert "At the same line (13), rank 2 called new_group(ranks=[0, 1]) instead" in (
        mismatch.message
    )


@pytest.mark.parametrize("swapped", [True, False])
def test_one_group_name_with_different_members_is_a_group_mismatch(swapped):
    # GIVEN 4 ranks creating the pair groups [0,1] and [2,3], ranks 2 and 3 "their own
    # group first" (swapped): group "1" is [0,1] on ranks 0,1 and [2,3] on ranks 2,3
    rs = ranks(4)
    for r in rs:
        first, second = ([2, 3], [0, 1]) if swapped and r.rank >= 2 else ([0, 1], [2, 3])
        for gid, members in (("1", first), ("2", second)):
            r.newgroup(members, gid if r.rank in members else None, line=16)
            if r.rank in members:
                r.create_group(gid, members, line=16)
    report = analyze(session([r.end() for r in rs]))
    # THEN only the swapped orders are named, with the lists each rank created
    mismatches = [f for f in report.findings if f.kind is FindingKind.GROUP_MISMATCH]
    if not swapped:
        assert report.verdict is Verdict.OK
        return
    assert report.verdict is Verdict.DEFECT
    (finding,) = [f for f in mismatches if f.group == "1"]
    assert "ranks 0 and 1 created it as new_group(ranks=[0, 1])" in finding.message
    assert "ranks 2 and 3 created it as new_group(ranks=[2, 3])" in finding.message
    assert {o.line for o in finding.ops} == {16}


def test_ranks_still_inside_a_group_creation_did_not_skip_the_later_ones():
    # GIVEN ranks 0 and 2 stuck creating group "1" of ranks [0, 2] (they disagree on its
    # order), while ranks 1 and 3 went on: new_group([1, 3]) is group "2", then a barrier
    rs = ranks(4)
    for r in rs:
        member = r.rank in (0, 2)
        r.newgroup([0, 2], "1" if member else None, line=12)
        if member:
            r.create_group("1", [0, 2], line=12, complete=False)
        else:
            r.newgroup([1, 3], "2", line=13)
            r.create_group("2", [1, 3], line=13)
            r.call("barrier", 20, complete=False)
    report = analyze(session(rs))
    # THEN ranks 0 and 2 are not said to have skipped new_group([1, 3]): they never got there
    assert not any(
        "never by" in f.message or "fewer times" in f.message for f in report.findings
    ), report.findings


def test_local_sync_group_names_that_differ_are_explained_by_the_groups_held():
    # GIVEN use_local_synchronization=True groups (hashed names): ranks 0 and 1 give the
    # group of ranks [0, 1] different names, as rank 0 held one group more when creating it
    r0, r1 = ranks(2)
    r0.newgroup([0, 1], "4a2ad14e", line=20)
    r0.create_group("4a2ad14e", [0, 1], line=20, complete=False)
    r1.newgroup([0, 1], "ad56679d", line=20)
    r1.create_group("ad56679d", [0, 1], line=20, complete=False)
    report = analyze(session([r0, r1]))
    (mismatch,) = [f for f in report.findings if f.kind is FindingKind.GROUP_MISMATCH]
    # THEN the message and the hints speak of the groups each member held, not of a skip
    assert "number of groups the calling rank already holds" in mismatch.message
    assert "skipped" not in mismatch.message
    assert "use_local_synchronization" in mismatch.hint
    deadlock = next(f for f in report.findings if f.kind is FindingKind.DEADLOCK)
    assert "members and non-members alike" not in deadlock.hint


def test_nonmember_call_is_a_defect():
    r0, r1 = ranks(2)
    r0.nonmember("all_reduce", 7, stack=[["t.py", 7, "main"]])
    report = analyze(session([r0.end(), r1.end()]))
    assert report.verdict is Verdict.DEFECT
    assert report.findings[0].ops[0].line == 7


def test_calls_that_are_no_op_name_the_scripts_line_as_ops_do():
    # GIVEN a non-member call and a new_group skipped by a member, each made inside an
    # installed library called from the script
    lib = "/venv/lib/python3.11/site-packages/accelerate/state.py"
    r0, r1 = ranks(2)
    r0.nonmember("all_reduce", 0, stack=[[lib, 80, "reduce"], ["train.py", 7, "main"]])
    r0.newgroup([0, 1], "1", stack=[[lib, 90, "group"], ["train.py", 5, "main"]])
    report = analyze(session([r0.end(), r1.end()]))
    # THEN both name the script's line, not the library's (the rule of Op.frame)
    lines = {f.kind: [(o.file, o.line) for o in f.ops] for f in report.findings}
    assert lines[FindingKind.NONMEMBER_CALL] == [("train.py", 7)]
    assert lines[FindingKind.GROUP_MISMATCH] == [("train.py", 5)]


def test_unmatched_isend_in_a_finished_job_is_a_defect():
    r0, r1 = ranks(2)
    r0.issue("send", 10, peer=1, **{"async": True})
    report = analyze(session([r0.end(), r1.end()]))
    assert report.verdict is Verdict.DEFECT
    assert kinds(report) == [FindingKind.P2P_UNMATCHED]


def test_ddp_stall_in_backward_waits_on_exited_rank():
    # GIVEN rank 0 inside backward with a pending DDP all_reduce; rank 1 exited
    r0, r1 = ranks(2)
    r0.call("all_reduce", 3)
    r1.call("all_reduce", 3)
    op_id = r0.issue("all_reduce", 40, api=None, **{"async": True})
    r0.state([op_id], "backward")
    report = analyze(session([r0, r1.end()], states={1: EXITED}))
    assert report.verdict is Verdict.DEFECT
    orphan = next(f for f in report.findings if f.kind is FindingKind.ORPHANED_WAIT)
    assert "join" in orphan.hint


def test_pending_async_op_while_computing_is_not_blocked():
    # GIVEN rank 0 has a pending isend but its main thread runs Python code
    r0, r1 = ranks(2)
    op_id = r0.issue("send", 10, peer=1, **{"async": True})
    r0.state([op_id], "python")
    r1.call("send", 20, peer=0, complete=False)
    assert analyze(session([r0, r1])).verdict is Verdict.OK


def test_hang_suspect_reported_not_deadlock():
    r0, r1 = ranks(2)
    r0.call("all_reduce", 10, complete=False)
    r1.state([], "python", stack=[["t.py", 33, "f"]])
    report = analyze(session([r0, r1]), quiet={1: 120.0}, suspect_after=60)
    assert report.verdict is Verdict.OK
    assert kinds(report) == [FindingKind.HANG_SUSPECT]
    assert "t.py:33" in report.findings[0].message


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_every_analysis_handles_the_empty_session(name):
    empty = Session(traces={})
    report = analyze(empty)
    assert report.verdict is Verdict.OK
    assert report.findings == ()


def test_p2p_dtype_mismatch_is_a_defect():
    # GIVEN a send of float32[4] received as int32[4]: gloo completes it with garbage
    r0, r1 = ranks(2)
    r0.call("send", 10, peer=1, dtype="float32")
    r1.call("recv", 20, peer=0, dtype="int32")
    report = analyze(session([r0.end(), r1.end()]))
    assert report.verdict is Verdict.DEFECT
    assert kinds(report) == [FindingKind.P2P_MISMATCH]
    assert {(o.rank, o.line) for o in report.findings[0].ops} == {(0, 10), (1, 20)}


def test_op_inside_an_installed_library_names_the_scripts_line():
    # GIVEN a collective issued inside transformers (stack: library frame, then script)
    lib = "/venv/lib/python3.11/site-packages/transformers/models/swin/modeling_swin.py"
    r0, r1 = ranks(2)
    r0.call("all_reduce", 10, redop="sum")
    r1.call("all_gather", 99, stack=[[lib, 481, "forward"], ["train.py", 42, "main"]])
    report = analyze(session([r0.end(), r1.end()]))
    # THEN the finding names the script's line, not the library's
    mismatch = next(f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISMATCH)
    assert {(o.rank, o.file, o.line) for o in mismatch.ops} == {
        (0, "train.py", 10),
        (1, "train.py", 42),
    }


def _poll_job(where: str):
    """Rank 0 irecvs from rank 1 (which sent) and the watchdog then sees it ``where``;
    rank 1 went on to a barrier."""
    r0, r1 = ranks(2)
    recv = r0.irecv(10, peer=1)
    r0.state([recv], where, stack=[["train.py", 12, "main"]])
    r1.call("send", 20, peer=0)
    r1.call("barrier", 21, complete=False)
    return r0, r1


def test_rank_spinning_on_is_completed_is_a_hang_naming_the_poll_line():
    # GIVEN rank 0 polling is_completed() on an irecv whose send completed, rank 1 in a
    # barrier waiting for it
    r0, r1 = _poll_job("poll")
    report = analyze(session([r0, r1]))
    # THEN it hangs: rank 0 spins (never in a deadlock set) and the finding names the
    # poll line, the matching send and the barrier waiting on rank 0
    assert report.verdict is Verdict.DEADLOCK
    assert kinds(report) == [FindingKind.BUSY_POLL]
    states = {s.rank: s.status for s in report.ranks}
    assert states == {0: "spinning", 1: "blocked"}
    (finding,) = report.findings
    assert finding.ranks == (0, 1)
    assert {(o.rank, o.line) for o in finding.ops} == {(0, 12), (1, 20), (1, 21)}
    assert "only once wait() is called" in finding.message


def test_rank_polling_a_collective_that_a_rank_in_python_never_joins_is_a_hang():
    # GIVEN rank 0 polls is_completed() on an async all_reduce that rank 1, running
    # Python code (waiting for a file of its own), never issues
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.call("all_reduce", 10)
    work = r0.issue("all_reduce", 20, **{"async": True})
    r0.state([work], "poll", stack=[["train.py", 21, "main"]])
    r1.state([], "python", stack=[["train.py", 24, "main"]])
    report = analyze(session([r0, r1]))
    # THEN not a deadlock: rank 1 may still come; the job hangs on it
    assert report.verdict is Verdict.HANG, report.findings
    assert FindingKind.BUSY_POLL in kinds(report)


def test_rank_computing_with_a_pending_irecv_is_not_spinning():
    # GIVEN the same job, but the watchdog sees rank 0 running Python (no polls)
    r0, r1 = _poll_job("python")
    report = analyze(session([r0, r1]))
    # THEN nothing is claimed about rank 0: it may come back and wait
    assert FindingKind.BUSY_POLL not in kinds(report)
    assert report.verdict is Verdict.OK


@pytest.mark.parametrize(
    ("timeout", "verdict"), [(5.0, Verdict.DEFECT), (1800.0, Verdict.DEADLOCK)]
)
def test_monitored_barrier_with_a_short_timeout_is_no_deadlock(timeout, verdict):
    # GIVEN ranks 0, 1 in a monitored_barrier, rank 2 in a plain barrier (it skipped one)
    r0, r1, r2 = ranks(3)
    for rank in (r0, r1):  # synchronous, no work: the call itself never returns
        rank.issue("monitored_barrier", 16, timeout=timeout, dtype=None, count=None)
        rank.records.pop()  # its ret
    r2.call("barrier", 17, complete=False)
    report = analyze(session([r0, r1, r2]))
    # THEN a short timeout makes rank 0 raise (naming rank 2) rather than hang: a defect;
    # with gloo's default timeout it is the same hang as a plain barrier
    assert report.verdict is verdict
    assert FindingKind.COLLECTIVE_MISMATCH in kinds(report)


def test_a_monitored_barrier_whose_coordinator_skipped_it_never_times_out():
    # GIVEN ranks 1, 2 in a monitored_barrier with a 5 s timeout; rank 0, the group's
    # first rank, which alone enforces the timeout, skipped it for an all_reduce
    r0, r1, r2 = ranks(3)
    for rank in (r1, r2):
        rank.issue("monitored_barrier", 18, timeout=5.0, dtype=None, count=None)
        rank.records.pop()  # its ret
    r0.call("all_reduce", 19, complete=False)
    report = analyze(session([r0, r1, r2]))
    # THEN the others wait for its answer forever: a deadlock, not a barrier that raises
    assert report.verdict is Verdict.DEADLOCK, report.findings
    assert FindingKind.COLLECTIVE_MISMATCH in kinds(report)


def test_a_rank_that_inits_again_after_destroy_is_not_ended():
    # GIVEN both ranks destroyed the default group, created it again, and then deadlock:
    # rank 0 in an all_reduce that rank 1 skipped, rank 1 in a recv from rank 0
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.call("all_reduce", 13)
        r.end("destroy")
        r.call("all_reduce", 17)
    r0.call("all_reduce", 21, complete=False)
    r1.call("recv", 24, peer=0, complete=False)
    report = analyze(session([r0, r1]))
    # THEN the ranks are blocked in the second generation, not gone: a deadlock there
    assert report.verdict is Verdict.DEADLOCK, report.findings
    deadlock = next(f for f in report.findings if f.kind is FindingKind.DEADLOCK)
    assert sorted((o.rank, o.line) for o in deadlock.ops) == [(0, 21), (1, 24)]


def test_an_op_id_written_twice_does_not_break_the_analysis():
    # GIVEN a damaged trace: rank 0 wrote a later op under an id it had used already (a
    # flipped digit), so its ops' indices have a gap once the first op is replaced
    r0, r1 = ranks(2)
    for rank in (r0, r1):
        rank.call("all_reduce", 10)
    r0._next_id = 0
    r0.isend(12, peer=1)
    r1.irecv(12, peer=0)
    for rank in (r0, r1):
        rank.call("barrier", 14)
    # THEN it is analysed like any other trace (the prediction replays it), no crash
    report = analyze(session([r0.end(), r1.end()]))
    assert report.verdict in (Verdict.OK, Verdict.DEFECT)


def test_a_ranks_child_job_of_one_process_does_not_replace_the_ranks_trace():
    from dl2.trace.session import build_session
    from trace_builders import RankBuilder

    # GIVEN rank 0 of a 2-rank job (its all_reduce done), and a later trace "rank 0" of
    # a one-process gloo job its child process ran (an eval) in the same run directory
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.call("all_reduce", 10)
        r.end()
    child = RankBuilder(0, 1, "eval.py")
    child.call("all_reduce", 5)
    child.end()
    traces = [r0.trace(wall=1), r1.trace(wall=1), child.trace(wall=9)]
    built = build_session(traces, {})
    # THEN the job's rank 0 is the one of its world; the child's is set aside, said so
    assert built.traces[0].header.world_size == 2
    assert analyze(built).verdict is Verdict.OK
    assert any("several trace files" in w for w in built.warnings)


@pytest.mark.parametrize(("op", "words"), [("broadcast", "model.module"), ("all_reduce", "join")])
def test_an_orphaned_op_ddp_issued_gets_the_hint_of_where_ddp_issued_it(op, words):
    # GIVEN rank 0's op, issued by DDP from C++ (no API), failed after rank 1 exited
    r0, r1 = ranks(2)
    op_id = r0.issue(op, 14, api=None)
    r0.wait(op_id, err="Connection closed by peer")
    report = analyze(session([r0, r1.end()], states={0: FAILED, 1: EXITED}))
    orphan = next(f for f in report.findings if f.kind is FindingKind.ORPHANED_WAIT)
    # THEN a broadcast is DDP's forward (buffers), an all_reduce its backward
    assert words in orphan.hint


def test_a_cycle_of_waited_isends_is_hinted_as_disagreeing_partners():
    # GIVEN each rank isends to the next and waits on it (they disagree on partners)
    builders = ranks(3)
    for r in builders:
        r.wait(r.isend(17, peer=(r.rank + 1) % 3), line=19, complete=False)
    report = analyze(session(builders))
    # THEN the hint does not tell them to use isend: it names the pairing
    hint = report.findings[0].hint
    assert "already isend" in hint and "use isend/irecv" not in hint


def test_a_point_to_point_deadlock_without_collectives_is_not_hinted_about_collectives():
    # GIVEN rank 0 receives from anyone with tag 1 while ranks 1 and 2 send it tag 2
    r0, r1, r2 = ranks(3)
    r0.call("recv", 16, peer=None, tag=1, complete=False)
    r1.call("send", 24, peer=0, tag=2, complete=False)
    r2.call("send", 24, peer=0, tag=2, complete=False)
    report = analyze(session([r0, r1, r2]))
    # THEN the hint speaks of matching sends and receives (tags included), not collectives
    hint = report.findings[0].hint
    assert "collective" not in hint and "tag" in hint


def test_a_group_creation_is_named_by_the_call_that_made_it():
    from dl2.analysis.describe import phrase
    from dl2.model.ops import Op

    init = Op(rank=0, id=1, op="create_group", gid="0", index=0, api="init_process_group")
    group = Op(rank=0, id=2, op="create_group", gid="1", index=1, api="new_group", ranks=(0, 1))
    assert phrase(init) == "init_process_group"
    assert phrase(group) == "new_group(ranks=[0, 1])"
