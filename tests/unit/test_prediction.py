"""Deadlock prediction under other backend configurations, over traces built in code."""

from __future__ import annotations

import json

import pytest

from dl2.analysis import analyze
from dl2.analysis.prediction import findings as potential
from dl2.analysis.prediction.search import Prediction
from dl2.analysis.prediction.search import predict
from dl2.analysis.prediction.search import sweep
from dl2.analysis.prediction.semantics import GLOO
from dl2.analysis.prediction.semantics import NCCL
from dl2.analysis.prediction.semantics import Semantics
from dl2.analysis.prediction.semantics import eager
from dl2.analysis.prediction.semantics import parse_semantics
from dl2.analysis.prediction.witness import witness_from_json
from dl2.analysis.prediction.witness import witness_to_json
from dl2.cli import main
from dl2.errors import ConfigError
from dl2.model.dtypes import op_bytes
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import build_execution_graph
from dl2.report import FindingKind
from dl2.report import Verdict
from dl2.trace.session import FAILED
from dl2.trace.session import build_session
from dl2.units import format_size
from dl2.units import parse_size
from trace_builders import RankBuilder
from trace_builders import ranks
from trace_builders import session
from trace_builders import two_sender_wildcards
from trace_builders import write_run_dir

#: Every configuration a correct program must stay clean under.
CONFIGURATIONS = [
    GLOO,
    NCCL,
    NCCL.with_buffer(0),
    NCCL.with_buffer(1024),
    eager(0),
    eager(1024),
    eager(64 << 10),
    eager(1 << 30),
]


def graph_of(builders: list[RankBuilder]) -> ExecutionGraph:
    return build_execution_graph(session(builders))


def ended(builders: list[RankBuilder]) -> list[RankBuilder]:
    for builder in builders:
        builder.end()
    return builders


# -- programs and their correct twins ---------------------------------------------------------


def send_send_exchange(nbytes: int) -> list[RankBuilder]:
    """Both ranks send first, then receive; the recorded run completed (as it does when the
    backend buffers the message)."""
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.call("send", 10 + r.rank, peer=1 - r.rank, dtype="uint8", count=nbytes)
        r.call("recv", 20 + r.rank, peer=1 - r.rank, dtype="uint8", count=nbytes)
    return ended([r0, r1])


def even_odd_ring(world: int = 4, nbytes: int = 1 << 20) -> list[RankBuilder]:
    rs = ranks(world)
    for r in rs:
        nxt, prv = (r.rank + 1) % world, (r.rank - 1) % world
        if r.rank % 2 == 0:
            r.call("send", 10, peer=nxt, dtype="uint8", count=nbytes)
            r.call("recv", 11, peer=prv, dtype="uint8", count=nbytes)
        else:
            r.call("recv", 12, peer=prv, dtype="uint8", count=nbytes)
            r.call("send", 13, peer=nxt, dtype="uint8", count=nbytes)
    return ended(rs)


def wildcard_race(one_sender: bool = False, follows: bool = False) -> list[RankBuilder]:
    """Rank 0: recv(any) then recv(from 2); ranks 1 and 2 send once each.  The recorded
    wildcard matched rank 1.  The twin: rank 1 sends both messages, rank 0 receives the
    second from rank 1.  ``follows``: the second recv's peer was computed from the
    wildcard's sender (``src=3 - first``: the recorder wrote ``via``)."""
    r0, r1, r2 = ranks(3)
    wildcard = r0.issue("recv", 10, peer=None)
    r0.wait(wildcard, src=1)
    r0.call("recv", 11, peer=1 if one_sender else 2, **({"via": wildcard} if follows else {}))
    r1.call("send", 20, peer=0)
    if one_sender:
        r1.call("send", 21, peer=0)
    else:
        r2.call("send", 30, peer=0)
    return ended([r0, r1, r2])


def batches(split: bool) -> list[RankBuilder]:
    """Rank 0: one batch of 5 isends to rank 1.  Rank 1: a batch of 4 irecvs, wait, then a
    batch of 1 (``split``), or one batch of 5 (the twin)."""
    r0, r1 = ranks(2)
    for op_id in r0.batch([("send", 1, 10)] * 5):
        r0.wait(op_id)
    for size in (4, 1) if split else (5,):
        for op_id in r1.batch([("recv", 0, 20 + size)] * size):
            r1.wait(op_id)
    return ended([r0, r1])


def batched_ring(world: int = 3) -> list[RankBuilder]:
    rs = ranks(world)
    for r in rs:
        ids = r.batch([("send", (r.rank + 1) % world, 10), ("recv", (r.rank - 1) % world, 11)])
        for op_id in ids:
            r.wait(op_id)
    return ended(rs)


def isend_irecv_exchange() -> list[RankBuilder]:
    """irecv and isend posted first, then both waited: never depends on buffering."""
    r0, r1 = ranks(2)
    for r in (r0, r1):
        recv = r.irecv(10, peer=1 - r.rank, count=1 << 20)
        send = r.isend(11, peer=1 - r.rank, count=1 << 20)
        r.wait(recv)
        r.wait(send)
    return ended([r0, r1])


def crossed_async_groups() -> list[RankBuilder]:
    """Two groups, all-reduces issued async in opposite orders, waited on afterwards."""
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.create_group("1", [0, 1])
        r.create_group("2", [0, 1])
        order = ("1", "2") if r.rank == 0 else ("2", "1")
        ids = [r.issue("all_reduce", 10 + i, gid=g, **{"async": True}) for i, g in enumerate(order)]
        for op_id in ids:
            r.wait(op_id)
    return ended([r0, r1])


def ddp_like() -> list[RankBuilder]:
    """Async all-reduces never waited on (DDP consumes futures), a blocking one after."""
    r0, r1 = ranks(2)
    for r in (r0, r1):
        for _ in range(3):
            r.issue("all_reduce", 40, api=None, **{"async": True})
        r.call("all_reduce", 41, redop="sum")
    return ended([r0, r1])


def master_worker(workers: int = 3, rounds: int = 2) -> list[RankBuilder]:
    """Rank 0 receives a request from any worker and replies to the sender it got
    (``src = recv(); send(dst=src)``); the workers send, then wait for the reply."""
    rs = ranks(workers + 1)
    order = [1 + (i % workers) for i in range(workers * rounds)]
    for src in order:
        w = rs[0].issue("recv", 10, peer=None)
        rs[0].wait(w, src=src)
        rs[0].call("send", 11, peer=src)
    for worker in rs[1:]:
        for _ in range(rounds):
            worker.call("send", 20, peer=0)
            worker.call("recv", 21, peer=0)
    return ended(rs)


def gather_any(world: int = 6) -> list[RankBuilder]:
    """Rank 0 receives one message from every other rank in whatever order they come."""
    rs = ranks(world)
    for src in range(world - 1, 0, -1):
        w = rs[0].issue("recv", 10, peer=None)
        rs[0].wait(w, src=src)
    for r in rs[1:]:
        r.call("send", 20, peer=0)
        r.call("barrier", 21)
    rs[0].call("barrier", 11)
    return ended(rs)


TWINS = {
    "master_worker": master_worker,
    "gather_any": gather_any,
    "even_odd_ring": even_odd_ring,
    "wildcard_one_sender": lambda: wildcard_race(one_sender=True),
    "matching_batches": lambda: batches(split=False),
    "batched_ring": batched_ring,
    "isend_irecv": isend_irecv_exchange,
    "ddp_like": ddp_like,
}


# -- semantics --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1024", 1024),
        ("64KiB", 65536),
        ("64k", 65536),
        ("4MiB", 4 << 20),
        ("1MB", 10**6),
        ("1,048,576", 1 << 20),
        ("2 GiB", 2 << 30),
    ],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "-1", "12 parsecs", "1.5MiB", "KiB"])
def test_parse_size_rejects(text):
    with pytest.raises(ConfigError, match="not a byte size"):
        parse_size(text)


def test_parse_semantics():
    assert parse_semantics("gloo") == GLOO
    assert parse_semantics("NCCL") == NCCL
    assert NCCL.eager_bytes == 4 << 20 and NCCL.fused_batches_atomic
    assert not GLOO.fused_batches_atomic and GLOO.eager_bytes == 0
    assert GLOO.any_source and not NCCL.any_source
    assert parse_semantics("nccl:1MiB") == NCCL.with_buffer(1 << 20)
    assert parse_semantics("eager:64KiB") == eager(65536)
    assert parse_semantics("rendezvous") == eager(0)
    assert not parse_semantics("gloo+serial").independent_groups
    for semantics in (
        GLOO,
        NCCL,
        eager(65536),
        NCCL.with_buffer(0),
        parse_semantics("nccl+serial"),
    ):
        assert parse_semantics(semantics.spec) == semantics
    with pytest.raises(ConfigError, match="unknown semantics"):
        parse_semantics("mpi")


def test_op_bytes_and_sizes():
    assert op_bytes("float32", 10) == 40
    assert op_bytes("bfloat16", 3) == 6
    assert op_bytes("int64", 2) == 16
    assert op_bytes("bool", 5) == 5
    assert op_bytes("uint8", 7) == 7
    assert op_bytes("torch.float64", 1) == 8
    assert op_bytes("mystery", 1) is None
    assert op_bytes("float32", None) is None
    assert format_size(4 << 20) == "4 MiB"
    assert format_size(65537) == "65,537 bytes"


# -- buffer size: a send/send exchange -----------------------------------------------------------


@pytest.mark.parametrize("nbytes", [65537, 1 << 20])
def test_send_send_deadlocks_exactly_below_its_message_size(nbytes):
    # GIVEN an exchange in which both ranks send nbytes first
    graph = graph_of(send_send_exchange(nbytes))
    # WHEN predicted with eager buffers just below, at and above the message size
    verdicts = {
        e: predict(graph, eager(e)).deadlock_possible for e in (0, nbytes - 1, nbytes, nbytes + 1)
    }
    # THEN it deadlocks exactly while the buffer is smaller than the message
    assert verdicts == {0: True, nbytes - 1: True, nbytes: False, nbytes + 1: False}
    # AND the witness names both sends and the threshold
    witness = predict(graph, eager(nbytes - 1)).witnesses[0]
    assert witness.threshold == nbytes
    assert witness.cycle == (0, 1)
    assert [(b.rank, b.ref.op, b.ref.line, b.nbytes) for b in witness.blocked] == [
        (0, "send", 10, nbytes),
        (1, "send", 11, nbytes),
    ]
    assert witness.causes == ("buffer",)


def test_sweep_over_buffer_sizes():
    graph = graph_of(send_send_exchange(65537))
    results = sweep(graph, [0, 1024, 65536, 65537, 4 << 20], semantics=eager(0))
    assert [(p.semantics.eager_bytes, p.deadlock_possible) for p in results] == [
        (0, True),
        (1024, True),
        (65536, True),
        (65537, False),
        (4 << 20, False),
    ]
    assert all(w.threshold == 65537 for p in results for w in p.witnesses)


def test_gloo_never_buffers_so_no_threshold():
    witness = predict(graph_of(send_send_exchange(64)), GLOO).witnesses[0]
    assert witness.threshold is None
    assert witness.semantics == GLOO


def test_send_send_finding_names_the_threshold():
    # GIVEN a recorded exchange of 1 MiB that completed (the recording backend buffered it)
    report = analyze(session(send_send_exchange(1 << 20)))
    # THEN it is a defect: it deadlocks under gloo, and under NCCL below a 1 MiB buffer
    assert report.verdict is Verdict.DEFECT
    assert report.exit_code == 4
    (finding,) = report.findings
    assert finding.kind is FindingKind.POTENTIAL_DEADLOCK
    assert finding.ranks == (0, 1)
    assert finding.cycle == (0, 1)
    assert "under gloo" in finding.message
    assert "when a send of 1,048,576 bytes exceeds the eager buffer" in finding.message
    assert "(4 MiB buffer: no; < 1 MiB: yes)" in finding.message
    assert [(o.rank, o.line) for o in finding.ops] == [(0, 10), (1, 11)]
    assert "buffering" in finding.hint


def test_send_send_above_the_nccl_buffer():
    report = analyze(session(send_send_exchange(8 << 20)))
    (finding,) = report.findings
    assert "(4 MiB buffer: yes; ≥ 8 MiB: no)" in finding.message


# -- wildcard matches ---------------------------------------------------------------------------


def test_wildcard_race_predicted_with_its_choice():
    # GIVEN the recorded run matched rank 1 and completed
    graph = graph_of(wildcard_race())
    # WHEN every match of the wildcard is explored under gloo
    prediction = predict(graph, GLOO)
    # THEN matching rank 2 first leaves recv(from 2) unmatched
    assert prediction.exhaustive
    (witness,) = prediction.witnesses
    (choice,) = witness.choices
    assert (choice.rank, choice.sender, choice.recorded_sender) == (0, 2, 1)
    assert choice.recv.line == 10 and choice.send is not None and choice.send.line == 30
    stuck = {b.rank: (b.ref.op, b.ref.peer, b.ref.line) for b in witness.blocked}
    assert stuck[0] == ("recv", 2, 11)
    assert stuck[1] == ("send", 0, 20)  # a gloo send waits for the receive that never comes
    assert witness.causes == ("wildcard",)
    # AND NCCL, which has no wildcard receive, keeps the recorded match
    assert not predict(graph, NCCL).deadlock_possible


def test_wildcard_whose_sender_the_program_follows_is_no_race():
    # GIVEN the race's trace, but the named recv's peer came from the wildcard's sender
    graph = graph_of(wildcard_race(follows=True))
    wildcard, named = graph.timelines[0].ops
    assert (wildcard.via, named.via) == (None, wildcard.id)
    # WHEN every match is explored under gloo THEN the wildcard keeps its recorded match:
    # the other order changes the named peer too, which the recording cannot replay
    assert predict(graph, GLOO).witnesses == ()
    report = analyze(session(wildcard_race(follows=True)))
    assert report.verdict == Verdict.OK, report.findings


def test_a_wildcard_where_the_program_followed_another_sender_keeps_its_match():
    # GIVEN a server (rank 0) whose receive from anyone, at one line, met an update or a
    # "done" from each worker: it replied (to the sender it got) to the updates only
    def job(follows: bool) -> list[RankBuilder]:
        r0, r1, r2 = ranks(3)
        for sender, update in ((1, True), (1, False), (2, True), (2, False)):
            wildcard = r0.issue("recv", 10, peer=None)
            r0.wait(wildcard, src=sender)
            if update:
                r0.call("send", 12, peer=sender, **({"via": wildcard} if follows else {}))
        for worker, line in ((r1, 20), (r2, 30)):
            worker.call("send", line, peer=0)
            worker.call("recv", line + 1, peer=0)
            worker.call("send", line + 2, peer=0)
        return ended([r0, r1, r2])

    def witnesses(follows: bool) -> tuple[object, ...]:
        traces = build_session([b.trace(follows=True) for b in job(follows)], {})
        return predict(build_execution_graph(traces), GLOO).witnesses

    # WHEN every other match is explored under gloo
    # THEN the receive that met rank 1's "done" keeps it: had it met rank 2's update the
    # server would have replied, which the recorded op sequence cannot show
    assert witnesses(follows=True) == ()
    # (with the replies' peers hard-coded, the same swap is a race the program can run)
    assert witnesses(follows=False) != ()
    # AND where no mark follows senders (older traces; a subgroup, whose sender torch
    # hands back through a dict), a reply to the recorded sender pins the call site too
    unmarked = build_session([b.trace() for b in job(follows=False)], {})
    assert predict(build_execution_graph(unmarked), GLOO).witnesses == ()


def test_a_header_then_the_payload_from_its_sender_is_no_race():
    # GIVEN rank 0 takes a header from anyone, then the payload from the sender the
    # header names (read from the data: no mark), twice; each worker sends both
    def job() -> list[RankBuilder]:
        r0, r1, r2 = ranks(3)
        for sender in (2, 1):
            wildcard = r0.issue("recv", 14, peer=None)
            r0.wait(wildcard, src=sender)
            r0.call("recv", 17, peer=sender)
        for worker in (r1, r2):
            worker.call("send", 24, peer=0)
            worker.call("send", 25, peer=0)
        return ended([r0, r1, r2])

    traces = build_session([b.trace(follows=True) for b in job()], {})
    # WHEN another arrival order of the headers is explored THEN none is predicted: the
    # payload's receive follows the header's sender, which a replay cannot
    assert predict(build_execution_graph(traces), GLOO).witnesses == ()


def test_a_named_peer_that_happens_to_be_the_recorded_sender_is_still_a_race():
    # GIVEN rank 0: recv(any), then a send to rank 1 *hard-coded* (no via), in traces
    # whose recorder marks the peers it derived from a wildcard (header follows)
    def job() -> list[RankBuilder]:
        r0, r1, r2 = ranks(3)
        wildcard = r0.issue("recv", 10, peer=None)
        r0.wait(wildcard, src=1)
        r0.call("send", 11, peer=1)
        r0.call("recv", 12, peer=None)
        r1.call("send", 20, peer=0)
        r1.call("recv", 21, peer=0)
        r2.call("send", 30, peer=0)
        return ended([r0, r1, r2])

    followed = build_session([b.trace(follows=True) for b in job()], {})
    old = build_session([b.trace() for b in job()], {})
    # THEN only the old traces read the send to the recorded sender as a reply (pinned);
    # the marked ones explore rank 2's message first: rank 0 then sends to rank 1, which
    # is still in its own send to rank 0
    assert predict(build_execution_graph(old), GLOO).witnesses == ()
    assert predict(build_execution_graph(followed), GLOO).witnesses != ()


def test_a_named_peer_after_a_subgroup_wildcard_is_a_race_where_subgroups_are_marked():
    # GIVEN the same program on a subgroup of every rank: rank 0 recv(any, group=sub),
    # then a send to rank 1 hard-coded (no via)
    def job() -> list[RankBuilder]:
        r0, r1, r2 = ranks(3)
        for r in (r0, r1, r2):
            r.create_group("1", [0, 1, 2])
        wildcard = r0.issue("recv", 10, peer=None, gid="1")
        r0.wait(wildcard, src=1)
        r0.call("send", 11, peer=1, gid="1")
        r0.call("recv", 12, peer=None, gid="1")
        r1.call("send", 20, peer=0, gid="1")
        r1.call("recv", 21, peer=0, gid="1")
        r2.call("send", 30, peer=0, gid="1")
        return ended([r0, r1, r2])

    def witnesses(**header: bool) -> tuple[object, ...]:
        traces = build_session([b.trace(**header) for b in job()], {})
        return predict(build_execution_graph(traces), GLOO).witnesses

    # THEN a recorder that keeps the mark through torch's translation of a subgroup's
    # sender (follows_groups) lets the other arrival order be explored: the deadlock;
    # one that did not (follows alone) may have lost a reply's mark: pinned
    assert witnesses(follows=True, follows_groups=True) != ()
    assert witnesses(follows=True) == ()


def test_wildcard_race_finding():
    report = analyze(session(wildcard_race()))
    assert report.verdict is Verdict.DEFECT
    (finding,) = report.findings
    assert finding.kind is FindingKind.POTENTIAL_DEADLOCK
    assert "matches rank 2 instead of rank 1 as recorded" in finding.message
    assert "train.py:11" in finding.message
    assert (0, 10) in [(o.rank, o.line) for o in finding.ops]  # the wildcard itself
    assert "named source" in finding.hint


def test_wildcard_witness_round_trips_through_json():
    witness = predict(graph_of(wildcard_race()), GLOO).witnesses[0]
    document = json.loads(json.dumps(witness_to_json(witness)))
    assert document["choices"][0]["sender"] == 2
    assert witness_from_json(document) == witness


def test_witness_from_json_rejects_foreign_documents():
    with pytest.raises(ConfigError, match="not a dl2 witness"):
        witness_from_json({"kind": "something"})
    with pytest.raises(ConfigError, match="format 99"):
        witness_from_json({"kind": "dl2-witness", "format": 99})


# -- fused batches -----------------------------------------------------------------------------


def test_batches_split_differently_deadlock_under_nccl_only():
    graph = graph_of(batches(split=True))
    assert not predict(graph, GLOO).deadlock_possible
    prediction = predict(graph, NCCL)
    (witness,) = prediction.witnesses
    assert witness.causes == ("batch",)
    assert witness.threshold is None  # no buffer size launches the batch
    by_rank = {b.rank: b for b in witness.blocked}
    assert by_rank[0].state == "not-launched"
    assert "only 4 of the 5 ops" in by_rank[0].note
    assert by_rank[0].ref.line == 10


def test_batch_split_finding():
    report = analyze(session(batches(split=True)))
    assert report.verdict is Verdict.DEFECT
    (finding,) = report.findings
    assert "under nccl" in finding.message and "gloo" not in finding.message
    assert "batch_isend_irecv" in finding.hint


# -- correct twins -----------------------------------------------------------------------------


@pytest.mark.parametrize("twin", sorted(TWINS))
@pytest.mark.parametrize("semantics", CONFIGURATIONS, ids=lambda s: s.spec)
def test_correct_twins_are_clean_under_every_configuration(twin, semantics):
    prediction = predict(graph_of(TWINS[twin]()), semantics)
    assert prediction.note is None
    assert prediction.exhaustive
    assert prediction.witnesses == ()


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_correct_twins_analyze_ok(twin):
    report = analyze(session(TWINS[twin]()))
    assert report.verdict is Verdict.OK, report.findings
    assert report.warnings == ()


def test_issue_order_semantics_serialises_groups():
    # GIVEN all-reduces on two groups issued async in opposite orders on the two ranks
    graph = graph_of(crossed_async_groups())
    # THEN groups progressing independently never deadlock; one serial queue per rank does
    assert not predict(graph, GLOO).deadlock_possible
    prediction = predict(graph, parse_semantics("gloo+serial"))
    (witness,) = prediction.witnesses
    assert "order" in witness.causes
    assert {b.rank for b in witness.blocked} == {0, 1}


def test_wait_position_decides():
    # GIVEN both ranks isend, then *wait* on it before posting their irecv
    r0, r1 = ranks(2)
    for r in (r0, r1):
        send = r.isend(10, peer=1 - r.rank, count=256)
        r.wait(send)
        r.call("recv", 11, peer=1 - r.rank, count=256)
    graph = graph_of(ended([r0, r1]))
    # THEN the waits are where the trace put them: a rendezvous send deadlocks
    assert graph.timelines[0].ops[0].waited_at == 1
    assert predict(graph, eager(0)).deadlock_possible
    assert not predict(graph, eager(1024)).deadlock_possible


# -- what is not predicted ------------------------------------------------------------------------


def test_recorded_deadlock_is_not_predicted_again():
    r0, r1 = ranks(2)
    r0.call("send", 10, peer=1, complete=False)
    r1.call("send", 20, peer=0, complete=False)
    report = analyze(session([r0, r1]))
    assert report.verdict is Verdict.DEADLOCK
    assert FindingKind.POTENTIAL_DEADLOCK not in {f.kind for f in report.findings}


def test_running_ranks_release_those_waiting_on_them():
    # GIVEN rank 0 in a send to rank 1, which is still computing (no end record)
    r0, r1 = ranks(2)
    r0.call("send", 10, peer=1, complete=False)
    r1.state([], "python")
    # THEN no configuration calls it a deadlock yet
    graph = graph_of([r0, r1])
    assert all(not predict(graph, s).deadlock_possible for s in CONFIGURATIONS)


def test_a_predicted_deadlock_holds_only_ranks_that_wait_on_nothing_that_can_move():
    # GIVEN ranks 0 and 1 exchanging send-first (buffered when recorded), rank 0 then
    # sending to rank 2, whose receive from any rank matched it; rank 3 is still running
    rs = ranks(4)
    r0, r1, r2, r3 = rs
    for r in (r0, r1):
        r.call("send", 10 + r.rank, peer=1 - r.rank)
        r.call("recv", 20 + r.rank, peer=1 - r.rank)
    r0.call("send", 12, peer=2)
    wildcard = r2.issue("recv", 30, peer=None)
    r2.wait(wildcard, src=0)
    r3.state([], "python")
    for r in (r0, r1, r2):
        r.end()
    # WHEN gloo's rendezvous sends deadlock ranks 0 and 1
    (witness,) = predict(graph_of(rs), GLOO).witnesses
    # THEN rank 2 is not part of it: its wildcard receive may still meet rank 3, which
    # may yet send (a rank's waits are merged into one set, read as any-of)
    assert witness.ranks == (0, 1)
    assert witness.cycle == (0, 1)


def test_a_trace_the_model_cannot_replay_predicts_nothing():
    # GIVEN a recv that completed although its sender never sent (an incomplete trace)
    r0, r1 = ranks(2)
    r0.call("recv", 10, peer=1)
    r0.call("send", 11, peer=1, count=1 << 20)
    r1.call("recv", 20, peer=0, count=1 << 20)
    builders = ended([r0, r1])
    prediction = predict(graph_of(builders), GLOO)
    assert prediction.witnesses == ()
    assert prediction.note is not None and "does not complete" in prediction.note
    report = analyze(session(builders))
    assert not any(f.kind is FindingKind.POTENTIAL_DEADLOCK for f in report.findings)
    assert any("prediction skipped" in w for w in report.warnings)


def test_search_bound():
    # GIVEN many wildcard receives with two possible senders each
    graph = graph_of(two_sender_wildcards())
    # WHEN the search may run only 5 states
    prediction = predict(graph, GLOO, max_states=5)
    # THEN it says it stopped; with room it explores every match and finds no deadlock
    assert not prediction.exhaustive and prediction.states == 5
    assert prediction.note == "search stopped after 5 states"
    full = predict(graph, GLOO)
    assert full.exhaustive and not full.deadlock_possible


def test_deviations_from_the_recorded_run_are_bounded():
    # GIVEN a program that deadlocks only if the first wildcard takes rank 2's message
    graph = graph_of(wildcard_race())
    # THEN zero deviations explore only the recorded path; one finds the deadlock
    assert not predict(graph, GLOO, max_deviations=0).deadlock_possible
    prediction = predict(graph, GLOO, max_deviations=1)
    assert prediction.deadlock_possible and prediction.max_deviations == 1


def test_symmetric_gather_is_explored_within_the_bound():
    # GIVEN rank 0 receiving from 7 ranks in any order: 7! orders, 2**7 states
    prediction = predict(graph_of(gather_any(8)), GLOO)
    # THEN every order within 3 deviations is explored, well inside the state bound
    assert prediction.exhaustive and not prediction.deadlock_possible
    assert prediction.states < 1000


def test_large_runs_are_skipped_with_a_warning(monkeypatch):
    monkeypatch.setattr(potential, "MAX_OPS", 3)
    report = analyze(session(send_send_exchange(1 << 20)))
    assert report.verdict is Verdict.OK
    assert any("prediction skipped" in w and "4 ops" in w for w in report.warnings)


def test_ten_thousand_ops_stay_cheap():
    # GIVEN 8 ranks x 1250 ops of ring exchanges and all-reduces
    rs = ranks(8)
    for _ in range(250):
        for r in rs:
            nxt, prv = (r.rank + 1) % 8, (r.rank - 1) % 8
            if r.rank % 2 == 0:
                r.call("send", 10, peer=nxt, count=1 << 18)
                r.call("recv", 11, peer=prv, count=1 << 18)
            else:
                r.call("recv", 12, peer=prv, count=1 << 18)
                r.call("send", 13, peer=nxt, count=1 << 18)
            r.call("all_reduce", 14)
            r.issue("all_reduce", 15, **{"async": True})
            r.call("barrier", 16)
    graph = graph_of(ended(rs))
    assert sum(len(t.ops) for t in graph.timelines.values()) == 10_000
    results: list[Prediction] = [predict(graph, s) for s in (GLOO, NCCL)]
    assert all(p.exhaustive and not p.deadlock_possible for p in results)


# -- the command line --------------------------------------------------------------------------


def test_cli_predict_reports_witnesses_and_replay(tmp_path, capsys):
    run_dir = write_run_dir(wildcard_race(), tmp_path / "run")
    out = tmp_path / "pred.json"
    assert main(["predict", str(run_dir), "--json", str(out)]) == 4
    text = capsys.readouterr().out
    assert "potential deadlock 1 under gloo" in text
    assert "matched rank 2 (recorded: rank 1)" in text
    assert "train.py:11" in text
    witness_files = sorted((run_dir / "witnesses").glob("*.json"))
    assert witness_files
    assert f"dl2 replay {run_dir} --buffer-size 0 --choices {witness_files[0]}" in text
    witness = witness_from_json(json.loads(witness_files[0].read_text()))
    assert witness.choices[0].sender == 2
    document = json.loads(out.read_text())
    assert [c["semantics"]["spec"] for c in document["configurations"]] == ["gloo", "nccl"]
    assert document["configurations"][0]["deadlock"] is True


def test_cli_predict_sweep_and_threshold(tmp_path, capsys):
    run_dir = write_run_dir(send_send_exchange(65537), tmp_path / "run")
    witness_dir = tmp_path / "w"
    argv = ["predict", str(run_dir), "--semantics", "nccl", "--buffer-sizes", "0,64KiB,4MiB"]
    assert main([*argv, "--witness-dir", str(witness_dir)]) == 4
    text = capsys.readouterr().out
    assert "nccl (64 KiB buffer)" in text and "nccl (4 MiB buffer)" in text
    assert "below 65,537 bytes" in text
    assert "--buffer-size 65536" in text
    assert len(list(witness_dir.glob("*.json"))) == 2  # at 0 and at 64 KiB


def test_cli_predict_clean_run(tmp_path, capsys):
    run_dir = write_run_dir(even_odd_ring(), tmp_path / "run")
    assert main(["predict", str(run_dir)]) == 0
    assert "ok" in capsys.readouterr().out
    assert not (run_dir / "witnesses").exists()


def test_cli_predict_recorded_deadlock(tmp_path, capsys):
    r0, r1 = ranks(2)
    r0.call("send", 10, peer=1, complete=False)
    r1.call("send", 20, peer=0, complete=False)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    assert main(["predict", str(run_dir)]) == 3
    assert "itself deadlocked" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--semantics", "mpi"], "unknown semantics"),
        (["--buffer-sizes", "1,lots"], "not a byte size"),
        (["--max-states", "0"], "must be positive"),
    ],
)
def test_cli_predict_bad_input(tmp_path, capsys, extra, message):
    run_dir = write_run_dir(even_odd_ring(), tmp_path / "run")
    assert main(["predict", str(run_dir), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cli_predict_missing_run_dir(tmp_path, capsys):
    assert main(["predict", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_semantics_label():
    assert GLOO.label == "gloo"
    assert NCCL.label == "nccl (4 MiB buffer)"
    assert Semantics("eager", 65536).label == "eager (64 KiB buffer)"


def test_a_batch_whose_peer_failed_before_posting_is_not_predicted_again():
    # GIVEN ranks 0 and 2 each posted a batch (irecv, isend) with rank 1, whose own
    # batch_isend_irecv raised before posting anything (its ops mixed two groups): their
    # waits failed when rank 1's program ended
    r0, r1, r2 = ranks(3)
    for r in (r0, r1, r2):
        r.create_group("1", [0, 1])
        r.create_group("2", [1, 2])
    closed = "RuntimeError: Connection closed by peer"
    for r, gid in ((r0, "1"), (r2, "2")):
        recv, send = r.batch([("recv", 1, 23), ("send", 1, 23)], gid=gid)
        r.wait(recv, err=closed)
        r.drop(send)
        r.end(err=closed, line=25)
    r1.end(err="ValueError: All ops need to use the same group", line=19)
    report = analyze(session([r0, r1, r2], states={0: FAILED, 1: FAILED, 2: FAILED}))
    # THEN the orphaned waits are the report: no deadlock "under nccl" of those very ops
    assert FindingKind.ORPHANED_WAIT in {f.kind for f in report.findings}
    assert FindingKind.POTENTIAL_DEADLOCK not in {f.kind for f in report.findings}, [
        f.message for f in report.findings
    ]


def test_a_run_with_ranks_communicating_from_two_threads_says_why_it_is_not_predicted():
    # GIVEN rank 1 receives from rank 2 in its main thread while another of its threads
    # sends to rank 2 (the file has the receive first); rank 2 receives, then sends
    r0, r1, r2 = ranks(3)
    r1.call("recv", 10, peer=2, tid=1)
    r1.call("send", 20, peer=2, tid=2)
    r2.call("recv", 30, peer=1)
    r2.call("send", 31, peer=1)
    report = analyze(session(ended([r0, r1, r2])))
    # THEN the run is ok, and the note names the threads, not a deadlock or a bad trace
    assert report.verdict is Verdict.OK
    (note,) = [w for w in report.warnings if "prediction skipped" in w]
    assert "rank(s) 1 communicate from several threads" in note
