"""The incremental model: folding, checkpoints, chunked reading, what a query costs.

Every session the unit tests build is also checked against matching from scratch, fed
in random pieces, folded and resumed from checkpoints (``tests/model_agreement.py``,
run by ``conftest.py``); these tests name the properties one by one.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from checkpoints import checkpoint_of
from checkpoints import resumed
from dl2.analysis import analyze
from dl2.model.checkpoint import CheckpointRecord
from dl2.model.execution_graph import StaleGraphError
from dl2.model.execution_graph import build_execution_graph
from dl2.model.incremental import Model
from dl2.model.incremental import stream_run
from dl2.model.ops import Op
from dl2.model.stuck import shortest_cycle
from dl2.model.wait_for import build_wait_for_graph
from dl2.report import FindingKind
from dl2.report import Verdict
from dl2.trace.session import load_session
from model_agreement import feed
from trace_builders import RankBuilder
from trace_builders import ranks
from trace_builders import session
from trace_builders import write_run_dir


def healthy_then_ring(world: int, steps: int, p2p_every: int = 0) -> list[RankBuilder]:
    """``steps`` all_reduce calls (and, every ``p2p_every`` steps, an exchange between
    neighbours), then every rank blocks sending to the next: a ring deadlock at line 99."""
    builders = ranks(world)
    for step in range(steps):
        for b in builders:
            b.call("all_reduce", 10 + step % 5, redop="sum")
        if p2p_every and step % p2p_every == 0:
            for b in builders:
                peer = b.rank ^ 1
                if peer < world:
                    first, second = ("send", "recv") if b.rank % 2 == 0 else ("recv", "send")
                    b.call(first, 30, peer=peer)
                    b.call(second, 31, peer=peer)
    for b in builders:
        b.call("send", 99, peer=(b.rank + 1) % world, complete=False)
    return builders


# -- folding ----------------------------------------------------------------------------


def test_a_deadlock_after_a_folded_history_has_the_same_cycle_and_lines():
    # GIVEN a long healthy history, then a ring deadlock
    traces = session(healthy_then_ring(4, 300, p2p_every=7))
    whole = analyze(traces)
    # WHEN the model keeps 50 ops and folds the rest as it is fed
    model = Model(window=50)
    peak = 0
    for trace, records, _ in _round_robin(traces):
        model.feed(trace.path, trace.header, records)
        peak = max(peak, model.matcher.retained)
    graph = model.graph()
    report = analyze(traces, graph=graph)
    # THEN memory stayed within the window (and the ops a rank is ahead of the others),
    # and the verdict, cycle and lines are the same
    assert graph.folded_ops > 1000 and peak <= 50 + 8
    assert report.verdict is Verdict.DEADLOCK
    assert report.findings[0] == whole.findings[0]
    assert report.findings[0].cycle == (0, 1, 2, 3)
    assert {(o.file, o.line) for o in report.findings[0].ops} == {("train.py", 99)}
    # and the analyses that need the whole history say they were skipped
    assert any(w.startswith("fusion check skipped: ") for w in report.warnings)


def test_once_history_was_folded_the_model_keeps_only_its_tail():
    # GIVEN a long healthy history, then a ring deadlock
    traces = session(healthy_then_ring(4, 300, p2p_every=7))
    whole = analyze(traces)
    # WHEN the model keeps every op up to 400, then folds down to a tail of 40
    model = Model(window=400, tail=40)
    sizes = []
    for trace, records, _ in _round_robin(traces):
        model.feed(trace.path, trace.header, records)
        sizes.append((model.matcher.folded > 0, model.matcher.retained))
    graph = model.graph()
    report = analyze(traces, graph=graph)
    # THEN it kept up to its window before the first fold, and its tail after it (plus
    # the ops a rank is ahead of the others)
    assert max(kept for folded, kept in sizes if not folded) > 390
    after = [kept for folded, kept in sizes if folded]
    assert len(after) > 1000 and max(after[10:]) <= 40 + 8
    # AND the verdict, cycle and lines are those of the whole history
    assert report.findings[0] == whole.findings[0]
    assert report.findings[0].cycle == (0, 1, 2, 3)
    # AND a tail is never more than the window
    assert Model(window=30).tail == 30 and Model(window=None).tail is None


def _round_robin(traces):
    """One record of each rank in turn: (trace, records, last)."""
    positions = dict.fromkeys(traces.traces, 0)
    while positions:
        for rank in list(positions):
            trace = traces.traces[rank]
            at = positions[rank]
            yield trace, trace.records[at : at + 1], at + 1 >= len(trace.records)
            positions[rank] = at + 1
            if at + 1 >= len(trace.records):
                del positions[rank]


def test_mismatched_unmatched_and_failed_ops_are_never_folded():
    r0, r1 = ranks(2)
    for step in range(20):
        r0.call("all_reduce", 10, redop="sum")
        r1.call("all_reduce", 10, redop="max" if step == 3 else "sum")  # a mismatch
    r0.call("send", 20, peer=1, dtype="float32")
    r1.call("recv", 21, peer=0, dtype="int32")  # matched, but the dtypes differ
    failed = r0.issue("all_reduce", 22, **{"async": True})
    r0.wait(failed, err="Connection closed by peer")
    r1.end()
    traces = session([r0, r1])
    graph = feed(traces, random.Random(3), window=0).graph()
    assert graph.folded_ops > 0
    kinds = {f.kind for f in analyze(traces, graph=graph).findings}
    assert {FindingKind.COLLECTIVE_MISMATCH, FindingKind.P2P_MISMATCH} <= kinds
    assert graph.slots["0"][0].index == 3 and graph.slots["0"][0].mismatched
    assert [op.frame.line for op in graph.failed_ops(0) if op.frame] == [22]


def test_the_recorded_seq_of_each_collective_is_its_position():
    r0, r1 = ranks(2)
    r0.create_group("1", [0, 1])
    r1.create_group("1", [0, 1])
    for _ in range(3):
        for b in (r0, r1):
            b.call("all_reduce", 10, gid="1")
            b.call("barrier", 11)
    graph = build_execution_graph(session([r0, r1]))
    for slots in graph.slots.values():
        assert all(op.seq == slot.index for slot in slots for op in slot.ops.values())


# -- checkpoints ------------------------------------------------------------------------


def test_a_rank_started_at_a_checkpoint_gives_the_same_deadlock():
    traces = session(healthy_then_ring(3, 40, p2p_every=5))
    cut = resumed(traces, 1, len(traces.traces[1].records) // 2)
    assert cut is not None and isinstance(cut.traces[1].records[0], CheckpointRecord)
    graph = build_execution_graph(cut)
    assert graph.resumed == {1} and not graph.complete
    assert analyze(cut).findings[0] == analyze(traces).findings[0]


def test_a_checkpoint_that_follows_its_history_changes_nothing():
    traces = session(healthy_then_ring(2, 10))
    records = traces.traces[0].records
    at = len(records) // 2
    checkpoint = checkpoint_of(records[:at], 0)
    whole = dataclasses.replace(
        traces.traces[0], records=(*records[:at], checkpoint, *records[at:])
    )
    again = dataclasses.replace(traces, traces={**traces.traces, 0: whole})
    graph = build_execution_graph(again)
    assert graph.complete
    assert [op.id for op in graph.timelines[0].ops] == [op.id for op in _ops(traces, 0)]
    assert analyze(again).findings == analyze(traces).findings


def _ops(traces, rank: int) -> tuple[Op, ...]:
    return build_execution_graph(traces).timelines[rank].ops


def test_a_checkpoint_after_a_gap_restarts_the_rank_there():
    traces = session(healthy_then_ring(2, 10))
    records = traces.traces[0].records
    checkpoint = checkpoint_of(records[:30], 0)
    gap = dataclasses.replace(traces.traces[0], records=(*records[:10], checkpoint, *records[30:]))
    with_gap = dataclasses.replace(traces, traces={**traces.traces, 0: gap})
    cut = resumed(traces, 0, 30)
    assert cut is not None
    assert _ops(with_gap, 0) == _ops(cut, 0)
    assert analyze(with_gap).findings == analyze(cut).findings


# -- reading ----------------------------------------------------------------------------


def _run_dirs(tmp_path: Path) -> list[Path]:
    """Run directories of several shapes (written with the builders)."""
    dirs = [write_run_dir(healthy_then_ring(3, 30, p2p_every=4), tmp_path / "ring")]
    r0, r1 = ranks(2)
    r0.call("all_reduce", 10)
    r0.end()
    r1.call("all_reduce", 10)
    r1.call("barrier", 11, complete=False)
    ok = write_run_dir([r0, r1], tmp_path / "orphan")
    with next(ok.glob("rank00001*")).open("a") as handle:
        handle.write('{"k":"ret","id":')  # a partial last record
    dirs.append(ok)
    corrupt = write_run_dir(healthy_then_ring(2, 5), tmp_path / "corrupt")
    path = next(corrupt.glob("rank00001*"))
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*lines[:4], "not json\n", *lines[4:]]))
    (corrupt / "rank00002.9.dl2.jsonl").write_text("")  # an empty file
    dirs.append(corrupt)
    twice = write_run_dir(healthy_then_ring(2, 4), tmp_path / "twice")
    newer = RankBuilder(1, 2)
    newer.call("all_reduce", 40)
    (twice / "rank00001.7.dl2.jsonl").write_text(newer.header(wall=5) + "".join(newer.records))
    dirs.append(twice)
    return dirs


@pytest.mark.parametrize("chunk", [1, 13, 1 << 20])
def test_reading_a_run_chunk_by_chunk_gives_the_report_of_a_whole_read(tmp_path, chunk):
    for run_dir in _run_dirs(tmp_path):
        traces, graph = stream_run(run_dir, chunk_bytes=chunk)
        loaded = load_session(run_dir)
        assert analyze(traces, graph=graph) == analyze(loaded), run_dir.name
        assert traces.warnings == loaded.warnings


def test_a_small_trace_is_opened_once(tmp_path, monkeypatch):
    import os

    import dl2.trace.stream as stream_module

    # GIVEN a run of 64 ranks whose traces each fit in the first read
    run_dir = write_run_dir(healthy_then_ring(64, 3), tmp_path / "run")
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(stream_module.os, "open", counting_open)
    # WHEN it is read chunk by chunk
    traces, graph = stream_run(run_dir)
    # THEN each file was opened once (not once more to find its end), and the report is
    # that of a whole read
    assert sorted(opened) == sorted(str(p) for p in run_dir.iterdir())
    assert analyze(traces, graph=graph) == analyze(load_session(run_dir))


def test_a_graph_read_after_more_records_is_refused():
    traces = session(healthy_then_ring(2, 2))
    model = Model()
    trace = traces.traces[0]
    model.feed(trace.path, trace.header, trace.records[:4])
    graph = model.graph()
    model.feed(trace.path, trace.header, trace.records[4:])
    with pytest.raises(StaleGraphError):
        graph.timelines[0]


def test_the_wait_for_graph_reads_only_the_waiting_ranks():
    # GIVEN 2,000 ranks of which two wait on each other and the rest finished
    builders = [RankBuilder(r, 2000) for r in range(2000)]
    for b in builders[2:]:
        b.end()
    builders[0].call("send", 5, peer=1, complete=False)
    builders[1].call("send", 5, peer=0, complete=False)
    model = Model()
    for b in builders:
        trace = b.trace()
        model.feed(trace.path, trace.header, trace.records)
    graph = model.graph()
    traces = session(builders[:2])
    # WHEN the wait-for graph is built
    wfg = build_wait_for_graph(traces, graph)
    # THEN it finds the deadlock having read the two ranks only
    assert wfg.deadlocked == {0, 1}
    assert set(graph.timelines._cache) == {0, 1}  # type: ignore[attr-defined]


def test_an_op_is_built_with_every_field():
    r0, r1 = ranks(2)
    op_id = r0.isend(3, peer=1, tag=7)
    r0.wait(op_id)
    graph = build_execution_graph(session([r0, r1]))
    op = graph.timelines[0].by_id[op_id]
    assert set(vars(op)) == {f.name for f in dataclasses.fields(Op)}
    assert op == Op(**{f.name: getattr(op, f.name) for f in dataclasses.fields(Op)})


# -- the shortest cycle -----------------------------------------------------------------


def _brute_cycle(waits: dict[int, list[int]]) -> tuple[int, ...]:
    """The definition, by enumeration: the shortest cycles, the lowest rank on one, the
    first in order of those through it, starting there."""
    cycles = []
    nodes = sorted(waits)
    for size in range(1, len(nodes) + 1):
        for order in itertools.permutations(nodes, size):
            if all(order[(i + 1) % size] in waits[order[i]] for i in range(size)):
                cycles.append(order)
        if cycles:
            break
    if not cycles:
        return ()
    lowest = min(min(c) for c in cycles)
    through = [c[c.index(lowest) :] + c[: c.index(lowest)] for c in cycles if lowest in c]
    return min(through)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.integers(0, 6), st.lists(st.integers(0, 7), max_size=4), min_size=1, max_size=7
    )
)
def test_the_shortest_cycle_is_the_one_the_definition_names(waits):
    clean = {r: [t for t in targets if t in waits] for r, targets in waits.items()}
    assert shortest_cycle(waits) == _brute_cycle(clean)


def test_the_shortest_cycle_of_a_long_ring_costs_its_length():
    ring = {r: [(r + 1) % 8192] for r in range(8192)}
    started = time.perf_counter()
    cycle = shortest_cycle(ring)
    assert cycle == tuple(range(8192))
    assert time.perf_counter() - started < 1.0


def test_ranks_that_create_one_group_hash_its_members_once_not_once_each():
    from dl2.model.matcher import Matcher
    from dl2.model.rank_state import OpState
    from dl2.trace.schema.decode import OpRecord

    hashed = 0

    class Members(tuple):  # type: ignore[type-arg]
        def __hash__(self) -> int:
            nonlocal hashed
            hashed += 1
            return super().__hash__()

    # GIVEN 2,000 ranks whose create_group records share one members tuple (as the
    # reader shares a range of ranks)
    world = Members(range(2000))
    matcher = Matcher({})
    # WHEN each rank's create_group arrives
    for rank in world:
        rec = OpRecord(id=1, gid="7", op="create_group", ranks=world)
        matcher.add(OpState(rec, rank, 0))
    # THEN every rank is a creator, and the 2,000-element tuple was hashed a few times,
    # not once per rank (which made 8,192 ranks cost 8,192^2)
    assert matcher.creators[("7", world)] == set(range(2000))
    assert hashed <= 3
