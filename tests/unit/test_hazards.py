"""Hazards the run did not hit: cross-group order inversions, NCCL batch order, buffering."""

from __future__ import annotations

import time

from dl2.analysis import analyze
from dl2.analysis.hazards import order_inversion_findings
from dl2.analysis.prediction.search import predict
from dl2.analysis.prediction.semantics import GLOO
from dl2.analysis.prediction.semantics import NCCL
from dl2.model.execution_graph import build_execution_graph
from dl2.model.wait_for import build_wait_for_graph
from dl2.report import FindingKind
from dl2.report import Verdict
from dl2.trace.session import build_session
from trace_builders import RankBuilder
from trace_builders import ranks
from trace_builders import session

ASYNC = {"async": True}


def _ended(builders: list[RankBuilder]) -> list[RankBuilder]:
    for builder in builders:
        builder.end()
    return builders


def _collectives(builders: list[RankBuilder], orders: dict[int, list[tuple[str, int]]]) -> None:
    """Each rank issues async all_reduces on (group, line) in its order, then waits all."""
    for r in builders:
        ids = [r.issue("all_reduce", line, gid=g, **ASYNC) for g, line in orders[r.rank]]
        for op_id in ids:
            r.wait(op_id)


def crossed_two_ranks(same_order: bool = False) -> list[RankBuilder]:
    rs = ranks(2)
    for r in rs:
        r.create_group("1", [0, 1])
        r.create_group("2", [0, 1])
    second = [("1", 20), ("2", 21)] if same_order else [("2", 20), ("1", 21)]
    _collectives(rs, {0: [("1", 10), ("2", 11)], 1: second})
    return _ended(rs)


def ring_of_pairs(consistent: bool = False) -> list[RankBuilder]:
    """Three pair groups {0,1}, {1,2}, {0,2}; each rank uses its two groups."""
    rs = ranks(3)
    for r in rs:
        r.create_group("1", [0, 1])
        r.create_group("2", [1, 2])
        r.create_group("3", [0, 2])
    if consistent:  # one global order: group 1, then 2, then 3
        orders = {0: [("1", 10), ("3", 11)], 1: [("1", 20), ("2", 21)], 2: [("2", 30), ("3", 31)]}
    else:
        orders = {0: [("1", 10), ("3", 11)], 1: [("2", 20), ("1", 21)], 2: [("3", 30), ("2", 31)]}
    _collectives(rs, orders)
    return _ended(rs)


def _hazards(builders: list[RankBuilder]):
    s = session(builders)
    graph = build_execution_graph(s)
    return order_inversion_findings(graph, build_wait_for_graph(s, graph))


# -- cross-group order inversions ---------------------------------------------------------------


def test_crossed_groups_are_a_hazard_naming_both_sides():
    # GIVEN two groups whose all_reduces rank 0 issues 1 then 2, rank 1 2 then 1 (async)
    report = analyze(session(crossed_two_ranks()))
    # THEN gloo completed it, but the report says it deadlocks on NCCL: a defect
    assert report.verdict is Verdict.DEFECT
    (finding,) = report.findings
    assert finding.kind is FindingKind.POTENTIAL_DEADLOCK
    assert finding.message.startswith("Deadlocks on NCCL")
    assert finding.ranks == (0, 1) and finding.cycle == (0, 1)
    assert [(op.rank, op.group, op.line) for op in finding.ops] == [
        (0, "1", 10),
        (0, "2", 11),
        (1, "2", 20),
        (1, "1", 21),
    ]
    assert "rank 0 issues all_reduce on group 1 (train.py:10) before" in finding.message


def test_three_pair_groups_in_a_ring_are_one_inversion():
    (finding,) = _hazards(ring_of_pairs())
    assert finding.ranks == (0, 1, 2)
    assert len(finding.ops) == 6
    assert {op.line for op in finding.ops} == {10, 11, 20, 21, 30, 31}


def test_consistent_orders_are_never_a_hazard():
    assert _hazards(crossed_two_ranks(same_order=True)) == []
    assert _hazards(ring_of_pairs(consistent=True)) == []
    assert analyze(session(ring_of_pairs(consistent=True))).verdict is Verdict.OK


def test_an_inversion_repeated_in_a_loop_is_one_finding():
    rs = ranks(2)
    for r in rs:
        r.create_group("1", [0, 1])
        r.create_group("2", [0, 1])
    for _ in range(50):
        _collectives(rs, {0: [("1", 10), ("2", 11)], 1: [("2", 20), ("1", 21)]})
    assert len(_hazards(_ended(rs))) == 1


def test_an_inversion_in_a_loop_then_a_barrier_is_one_finding():
    # GIVEN the crossed async pair of groups issued step after step, then a barrier (the
    # search for a second cycle once looked in what was no longer cyclic: IndexError)
    rs = ranks(2)
    for r in rs:
        r.create_group("1", [0, 1])
        r.create_group("2", [0, 1])
    for _ in range(3):
        _collectives(rs, {0: [("1", 21), ("2", 22)], 1: [("2", 21), ("1", 22)]})
    for r in rs:
        r.call("barrier", 30)
    (finding,) = _hazards(_ended(rs))
    assert finding.ranks == (0, 1)


def test_two_threads_each_on_its_own_group_are_no_inversion():
    # GIVEN two threads per rank, one per group, whose issues interleave differently
    rs = ranks(2)
    for r in rs:
        r.create_group("1", [0, 1])
        r.create_group("2", [0, 1])
    for r, order in zip(rs, ([("1", 10), ("2", 20)], [("2", 20), ("1", 10)]), strict=True):
        ids = [r.issue("all_reduce", line, gid=g, tid=int(g), **ASYNC) for g, line in order]
        for op_id in ids:
            r.wait(op_id)
    # THEN program order holds per thread only: no hazard
    assert _hazards(_ended(rs)) == []


def test_hazards_off_reports_only_what_happened():
    assert analyze(session(crossed_two_ranks()), hazards=False).verdict is Verdict.OK


def test_the_inversion_check_is_linear():
    # GIVEN a long consistent history on two groups (20,000 collectives per rank)
    rs = ranks(2)
    for r in rs:
        r.create_group("1", [0, 1])
        r.create_group("2", [0, 1])
    for _ in range(10_000):
        _collectives(rs, {0: [("1", 10), ("2", 11)], 1: [("1", 20), ("2", 21)]})
    s = build_session([b.trace() for b in _ended(rs)], {})  # no agreement check: long
    graph = build_execution_graph(s)
    wfg = build_wait_for_graph(s, graph)
    start = time.perf_counter()
    assert order_inversion_findings(graph, wfg) == []
    assert time.perf_counter() - start < 5.0


# -- NCCL launches a rank's batches in order -------------------------------------------------


def _batches(first: dict[int, list[tuple[str, int, int]]], then: dict[int, list]) -> list:
    rs = ranks(2)
    for r in rs:
        ids = r.batch(first[r.rank], count=256)
        if then[r.rank]:
            ids += r.batch(then[r.rank], count=256)
        for op_id in ids:
            r.wait(op_id)
    return _ended(rs)


def test_receive_batches_before_send_batches_deadlock_on_nccl_only():
    # GIVEN both ranks post a batch [irecv] and then a batch [isend]
    builders = _batches(
        {0: [("recv", 1, 10)], 1: [("recv", 0, 20)]}, {0: [("send", 1, 11)], 1: [("send", 0, 21)]}
    )
    graph = build_execution_graph(session(builders))
    # THEN gloo (op by op) completes, NCCL (one stream per rank) cannot, whatever the buffer
    assert not predict(graph, GLOO).deadlock_possible
    assert predict(graph, NCCL).deadlock_possible
    report = analyze(session(builders))
    assert report.verdict is Verdict.DEFECT
    (finding,) = report.findings
    assert "under nccl" in finding.message
    assert {op.line for op in finding.ops} == {10, 20}


def test_a_batch_holding_both_directions_meets_a_peer_that_splits_them():
    # GIVEN rank 0: one batch [isend, irecv]; rank 1: [isend], then [irecv]
    builders = _batches(
        {0: [("send", 1, 10), ("recv", 1, 11)], 1: [("send", 0, 20)]},
        {0: [], 1: [("recv", 0, 21)]},
    )
    graph = build_execution_graph(session(builders))
    # THEN NCCL completes it at every buffer size: no hazard
    for semantics in (NCCL, NCCL.with_buffer(0)):
        assert not predict(graph, semantics).deadlock_possible
    assert analyze(session(builders)).verdict is Verdict.OK


# -- async works never waited on -------------------------------------------------------------


def _unwaited(builders: list[RankBuilder]):
    return [f for f in analyze(session(builders)).findings if f.kind is FindingKind.UNWAITED_WORK]


def test_an_isend_dropped_in_a_loop_is_one_finding_naming_its_line():
    r0, r1 = ranks(2)
    for _ in range(3):
        r0.isend(12, peer=1)
        r1.call("recv", 20, peer=0)
    report = analyze(session(_ended([r0, r1])))
    assert report.verdict is Verdict.DEFECT
    (finding,) = report.findings
    assert finding.kind is FindingKind.UNWAITED_WORK
    assert finding.ranks == (0, 1)
    assert (finding.ops[0].rank, finding.ops[0].line) == (0, 12)
    assert "isend to rank 1" in finding.message and "(3 works)" in finding.message


def test_an_irecv_outstanding_at_exit_is_reported():
    r0, r1 = ranks(2)
    r1.irecv(15, peer=0)
    r0.call("send", 25, peer=1)
    (finding,) = _unwaited(_ended([r0, r1]))
    assert (finding.ops[0].rank, finding.ops[0].line) == (1, 15)


def test_an_irecv_left_by_a_program_that_raised_is_not_an_unwaited_work():
    # GIVEN rank 1 posted an irecv, then its program raised before the wait
    r0, r1 = ranks(2)
    r1.irecv(15, peer=0)
    r0.call("send", 25, peer=1)
    r0.end()
    r1.end(err="ValueError: Global rank 3 is not part of group", line=16)
    # THEN the exception, not a lost work, is why it was never waited on
    assert _unwaited([r0, r1]) == []


def test_works_waited_seen_complete_or_of_a_waited_batch_are_not_reported():
    r0, r1 = ranks(2)
    sends = [r0.isend(10 + i, peer=1) for i in range(3)]
    for op_id in reversed(sends):  # waited in any order
        r0.wait(op_id)
    recvs = r1.batch([("recv", 0, 20)] * 3)
    r1.wait(recvs[-1])  # one wait on the batch covers its works
    # a collective with async_op=True never waited (DDP waits in C++): not a P2P work
    for r in (r0, r1):
        r.issue("all_reduce", 30, **ASYNC)
    assert _unwaited(_ended([r0, r1])) == []


def test_a_work_seen_complete_by_is_completed_is_not_reported():
    r0, r1 = ranks(2)
    op_id = r0.isend(12, peer=1)
    r0.done(op_id)  # is_completed() returned True
    r1.call("recv", 20, peer=0)
    assert _unwaited(_ended([r0, r1])) == []


def test_ranks_still_running_are_not_judged():
    r0, r1 = ranks(2)
    r0.isend(12, peer=1)
    assert _unwaited([r0, r1]) == []


def test_the_finding_names_the_peer_op_left_waiting_or_failed():
    # GIVEN rank 0 exits with an isend outstanding; rank 1 still in the matching recv
    r0, r1 = ranks(2)
    r0.isend(12, peer=1)
    r1.call("recv", 20, peer=0, complete=False)
    (finding,) = _unwaited([r0.end(), r1])
    assert [(op.rank, op.line) for op in finding.ops] == [(0, 12), (1, 20)]
    assert "Rank 1's recv from rank 0 (train.py:20) waits on it" in finding.message
    # GIVEN the recv failed instead (gloo saw the pair torn down)
    r0, r1 = ranks(2)
    r0.isend(12, peer=1)
    r1.wait(r1.issue("recv", 20, peer=0), err="RuntimeError: Connection closed by peer")
    (finding,) = _unwaited([r0.end(), r1.end()])
    assert "failed: RuntimeError: Connection closed by peer" in finding.message
