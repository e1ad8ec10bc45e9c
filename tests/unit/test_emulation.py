"""Emulated send semantics: the recorder's helpers and how the analysis reads their records."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from dl2.analysis import analyze
from dl2.analysis.prediction.search import predict
from dl2.analysis.prediction.semantics import GLOO
from dl2.analysis.prediction.semantics import Semantics
from dl2.analysis.prediction.semantics import recorded_semantics
from dl2.model.execution_graph import build_execution_graph
from dl2.model.incremental import build_timeline
from dl2.model.stuck import RankStatus
from dl2.model.wait_for import build_wait_for_graph
from dl2.record import emulate
from dl2.report import Verdict
from dl2.trace.session import Session
from dl2.trace.session import build_session
from trace_builders import RankBuilder
from trace_builders import ranks
from trace_builders import session


def with_headers(builders: list[RankBuilder], **fields: Any) -> Session:
    """A session whose rank headers carry ``fields`` (backend, emulate)."""
    return build_session([builder.trace(**fields) for builder in builders], {})


def eager_exchange(nbytes: int) -> list[RankBuilder]:
    """Both ranks send first (eagerly: the sends return at once), then receive."""
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.call("send", 10, peer=1 - r.rank, dtype="uint8", count=nbytes, eager=True)
        r.call("recv", 11, peer=1 - r.rank, dtype="uint8", count=nbytes)
        r.end()
    return [r0, r1]


# -- environment -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"), [("", -1), ("0", 0), ("65536", 65536), ("64KiB", -1), ("-3", -1)]
)
def test_buffer_size_from_env(value: str, expected: int) -> None:
    # GIVEN DL2_BUFFER_SIZE as `dl2 run` writes it (plain bytes) or garbage
    assert emulate.eager_bytes_from_env({emulate.ENV_BUFFER_SIZE: value}) == expected


def test_fused_batches_and_drain_from_env() -> None:
    assert emulate.fused_batches_from_env({emulate.ENV_FUSED_BATCHES: "1"})
    assert not emulate.fused_batches_from_env({})
    assert emulate.drain_seconds_from_env({emulate.ENV_DRAIN_S: "2.5"}) == 2.5
    assert emulate.drain_seconds_from_env({emulate.ENV_DRAIN_S: "x"}) == emulate.DEFAULT_DRAIN_S


# -- the eager sends kept alive ---------------------------------------------------------------


class SlowWork:
    """A gloo work stand-in whose wait() returns once released."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def wait(self) -> bool:
        self.released.wait(5)
        return True


def test_eager_sends_are_kept_until_delivered_and_drained() -> None:
    # GIVEN two eager sends whose messages are not delivered yet
    sends = emulate.EagerSends()
    works = [SlowWork(), SlowWork()]
    for work in works:
        sends.add(work, ["buffer"])
    # WHEN nothing is delivered THEN a bounded drain gives up with both undelivered
    assert sends.drain(0.05) == 2
    # WHEN they are delivered THEN the drain ends with none left
    for work in works:
        work.released.set()
    assert sends.drain(5) == 0
    assert len(sends) == 0


def test_a_failing_delivery_does_not_stop_the_reaper() -> None:
    class Failing:
        def wait(self) -> bool:
            raise RuntimeError("Connection closed by peer")

    sends = emulate.EagerSends()
    sends.add(Failing(), [])
    done = SlowWork()
    done.released.set()
    sends.add(done, [])
    assert sends.drain(5) == 0


# -- the fused-batch gate ----------------------------------------------------------------------


class FakeStore:
    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.lock = threading.Lock()

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            self.values[key] = self.values.get(key, 0) + amount
            return self.values[key]


class Placeholder:
    def __init__(self) -> None:
        self.work: Any = None

    def _dl2_bind(self, work: Any) -> None:
        self.work = work


def test_a_batch_launches_only_when_every_op_can_be_matched() -> None:
    # GIVEN rank 0 posts a batch of two sends to rank 1 (one shared store)
    store = FakeStore()
    gate = emulate.BatchGate()
    gate._store = store
    issued: list[int] = []
    holders = []
    for n in range(2):
        position = gate.post("send", "0", 0, 1, 0)
        holder = Placeholder()
        holders.append(holder)
        keys = gate.partner_keys("send", "0", 0, 1, 0)
        gate.defer(1, emulate.Deferred(lambda n=n: issued.append(n) or n, keys, position, holder))
    launcher = threading.Thread(target=gate.launch, args=(1,))
    launcher.start()
    # WHEN rank 1 has posted only one receive THEN the batch waits
    store.add(emulate.channel_key("recv", "0", 0, 1, 0), 1)
    time.sleep(0.1)
    assert issued == [] and launcher.is_alive()
    # WHEN it posts the second THEN both sends are issued, in call order
    store.add(emulate.channel_key("recv", "0", 0, 1, 0), 1)
    launcher.join(5)
    assert issued == [0, 1]
    assert [h.work for h in holders] == [0, 1]


def test_wildcard_receives_count_as_partners_of_any_send() -> None:
    keys = emulate.BatchGate.partner_keys("send", "g", 2, 0, 5)
    assert emulate.channel_key("recv", "g", emulate.WILD, 0, 5) in keys
    assert emulate.BatchGate.partner_keys("recv", "g", None, 0, 5) == (
        emulate.channel_key("send", "g", emulate.WILD, 0, 5),
    )


# -- the analysis of emulated records --------------------------------------------------------


def test_an_eager_send_completes_when_issued() -> None:
    r0, _ = ranks(2)
    op_id = r0.issue("send", 10, peer=1, eager=True)  # issued, never waited, not received
    timeline = build_timeline(r0.trace())
    op = timeline.by_id[op_id]
    assert op.eager and op.issued and op.completed


def test_a_rank_inside_an_eager_send_is_not_blocked() -> None:
    # GIVEN rank 0's trace ends inside an eager send (op record, no ret yet)
    r0, r1 = ranks(2)
    eager_send = {"peer": 1, "tag": 0, "dtype": "uint8", "count": 8, "eager": True}
    r0.issue("send", 1, api=None, stack=[], returned=False, **eager_send)
    r1.call("recv", 20, peer=0, complete=False, count=8, dtype="uint8")
    s = session([r0, r1])
    wfg = build_wait_for_graph(s, build_execution_graph(s))
    # THEN rank 0 is about to go on, not blocked, and nothing is deadlocked
    assert wfg.nodes[0].status == RankStatus.RUNNING
    assert not wfg.deadlocked


def test_an_unlaunched_fused_batch_blocks_its_partners() -> None:
    # GIVEN rank 0 sits in a fused batch of two sends (recorded, not issued): rank 1 posted
    # one receive only, and waits on it
    r0, r1 = ranks(2)
    for _ in (1, 2):
        fields = {"peer": 1, "tag": 0, "count": 8, "async": True, "batch": 1, "deferred": True}
        r0.issue("send", 5, api=None, returned=False, **fields)
    recv = r1.irecv(20, peer=0, count=8, api="batch_isend_irecv", batch=1)
    r1.wait(recv, complete=False)
    s = session([r0, r1])
    graph = build_execution_graph(s)
    assert [o.id for o in graph.timelines[0].blocked.ops] == [1, 2]  # type: ignore[union-attr]
    wfg = build_wait_for_graph(s, graph)
    # THEN rank 0 waits on rank 1 (its second send is unmatched) and rank 1 on rank 0
    # (its receive's partner is not launched): a deadlock
    assert wfg.nodes[0].status == RankStatus.BLOCKED and wfg.nodes[0].targets == (1,)
    assert wfg.nodes[1].targets == (0,)
    assert wfg.deadlocked == {0, 1}


def test_recorded_semantics_from_the_headers() -> None:
    builders = eager_exchange(64)
    assert recorded_semantics(with_headers(builders, backend="gloo")) == GLOO
    emulated = with_headers(builders, backend="gloo", emulate=(64, False))
    assert recorded_semantics(emulated) == Semantics("eager", eager_bytes=64)
    fused = with_headers(builders, backend="gloo", emulate=(0, True))
    semantics = recorded_semantics(fused)
    assert semantics is not None and semantics.fused_batches_atomic
    assert recorded_semantics(with_headers(builders, backend="nccl")) is None


def test_a_run_under_an_emulated_buffer_is_judged_under_that_buffer() -> None:
    # GIVEN a send/send exchange of 64 bytes that completed under an emulated 64-byte buffer
    s = with_headers(eager_exchange(64), backend="gloo", emulate=(64, False))
    # THEN with hazards off it is clean (the buffer it ran under holds its messages) ...
    assert analyze(s, hazards=False).verdict is Verdict.OK
    # ... and by default a hazard: it completed only because its sends were buffered
    report = analyze(s)
    assert report.verdict is Verdict.DEFECT, report.findings
    (finding,) = report.findings
    assert finding.message.startswith("Deadlocks when sends of 64 bytes or more are not buffered")
    assert finding.ranks == (0, 1)
    # ... while under gloo (no buffer), which `dl2 predict` explores, it deadlocks
    recorded = recorded_semantics(s)
    prediction = predict(build_execution_graph(s), GLOO, recorded=recorded)
    assert prediction.deadlock_possible, prediction.note


# -- the command line --------------------------------------------------------------------------


def test_run_and_replay_take_sizes_with_units(capsys: pytest.CaptureFixture[str]) -> None:
    from dl2.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["run", "--buffer-size", "64KiB", "-n", "2", "train.py"])
    assert args.buffer_size == 65536
    assert parser.parse_args(["replay", "runs/x", "--buffer-size", "4095"]).buffer_size == 4095
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["run", "--buffer-size", "lots", "-n", "2", "train.py"])
    assert exit_.value.code == 2
    assert "lots" in capsys.readouterr().err
