"""The incremental model agrees with matching from scratch, however its records come.

:func:`check_agreement` takes a session and checks that

* the model fed each trace at once builds what :mod:`model_oracle` matches from scratch
  (slots, collective positions, P2P partners, groups, creators, wait-for graph over
  every rank), and that the recorded ``seq`` of each collective is its position;
* fed records one at a time and in random chunks, ranks interleaved at random, it
  builds the same timelines, matches, wait-for graph, cycle and report, and so it does
  fed each blocking call in one call (:meth:`Model.feed_calls`);
* with a window of 0 (every finished unit folded at once), it finds the same deadlock
  set, cycle, blocked ranks and findings (all but the whole-history ones: prediction
  and fusion, which say instead that they were skipped);
* for a deadlock, with any one rank's trace starting at a checkpoint synthesised from
  its first records (:mod:`checkpoints`), it finds the same deadlock set, cycle and
  deadlock findings (their lines included) and the same verdict.

``tests/unit/conftest.py`` runs it on every session the unit tests build with
``trace_builders``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from checkpoints import resumed
from dl2.analysis import analyze
from dl2.analysis.matching import SHIFT_SENTENCE
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import build_execution_graph
from dl2.model.incremental import Model
from dl2.model.ops import P2P_OPS
from dl2.model.wait_for import WaitForGraph
from dl2.model.wait_for import build_wait_for_graph
from dl2.report import FindingKind
from dl2.report import Report
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import StoreRecord
from dl2.trace.schema.decode import WaitRecord
from dl2.trace.session import Session
from model_oracle import oracle_graph
from model_oracle import oracle_wait_for

#: findings that need the whole history (a folded model skips them, with a note)
WHOLE_HISTORY = {FindingKind.POTENTIAL_DEADLOCK, FindingKind.POTENTIAL_MISMATCH}
#: what a deadlock report says of the deadlock itself
DEADLOCK_KINDS = {FindingKind.DEADLOCK, FindingKind.ORPHANED_WAIT}


def chunks(session: Session, rng: random.Random | None, largest: int) -> Iterator[Any]:
    """(trace, records, last) pieces of every trace, in file order per rank and ranks
    interleaved at random (``rng`` None: one record at a time, ranks in turn)."""
    cursors = {rank: 0 for rank in session.traces}
    for trace in session.traces.values():
        yield trace, (), not trace.records
    live = [r for r, t in session.traces.items() if t.records]
    turn = 0
    while live:
        rank = rng.choice(live) if rng is not None else live[turn % len(live)]
        turn += 1
        trace = session.traces[rank]
        size = rng.randint(1, largest) if rng is not None else 1
        start = cursors[rank]
        end = min(start + size, len(trace.records))
        cursors[rank] = end
        if end == len(trace.records):
            live.remove(rank)
        yield trace, trace.records[start:end], end == len(trace.records)


def feed(session: Session, rng: random.Random | None, window: int | None = None) -> Model:
    model = Model(window=window)
    for trace, records, last in chunks(session, rng, 7):
        model.feed(trace.path, trace.header, records, trace.truncated if last else None)
    return model


def feed_calls(session: Session) -> Model:
    """The model fed each trace whole, each blocking call (op, its ret, a wait on it,
    the wait's ret, without err or src) through :meth:`Model.feed_calls` and the other
    records through :meth:`Model.feed`, in file order, as a reader that recognises
    blocking calls would."""
    model = Model(window=None)
    for trace in session.traces.values():
        records = trace.records
        other: list[Any] = []
        ops: list[OpRecord] = []
        waits: list[int] = []
        i = 0
        while i < len(records):
            rec = records[i]
            unit = records[i : i + 4]
            if (
                isinstance(rec, OpRecord)
                and len(unit) == 4
                and isinstance(unit[1], RetRecord)
                and unit[1].id == rec.id
                and unit[1].err is None
                and isinstance(unit[2], WaitRecord)
                and unit[2].work == rec.id
                and unit[2].stack == rec.stack  # a "k" line: waited on where issued
                and isinstance(unit[3], RetRecord)
                and unit[3].id == unit[2].id
                and unit[3].err is None
                and unit[3].src is None
            ):
                if other:
                    model.feed(trace.path, trace.header, other)
                    other = []
                ops.append(rec)
                waits.append(unit[2].id)
                i += 4
                continue
            if ops:
                model.feed_calls(trace.path, trace.header, ops, waits)
                ops, waits = [], []
            other.append(rec)
            i += 1
        if ops:
            model.feed_calls(trace.path, trace.header, ops, waits)
        model.feed(trace.path, trace.header, other, trace.truncated)
    return model


def matches(graph: Any) -> dict[str, Any]:
    """What matching found, as plain values."""
    return {
        "groups": dict(graph.groups),
        "slots": {gid: tuple(slots) for gid, slots in graph.slots.items()},
        "where": dict(graph.collective_slot),
        "partners": dict(graph.p2p_partner),
    }


def wait_for_state(wfg: WaitForGraph) -> tuple[Any, ...]:
    return dict(wfg.nodes), wfg.deadlocked, wfg.shortest_cycle()


def _report(session: Session, graph: ExecutionGraph) -> Report:
    return analyze(session, graph=graph)


def check_agreement(session: Session, seed: int = 0) -> None:
    whole = build_execution_graph(session)
    timelines = {rank: whole.timelines[rank] for rank in whole.timelines}
    oracle = oracle_graph(timelines, whole.world_size)
    # the model fed whole traces against matching from scratch
    assert matches(whole) == matches(oracle)
    for key, creators in oracle.creators.items():
        assert whole.group_creators(*key) == creators
    wfg = build_wait_for_graph(session, whole)
    nodes, deadlocked = oracle_wait_for(session, oracle)
    assert dict(wfg.nodes) == nodes
    assert wfg.deadlocked == deadlocked
    assert dict(wfg.waiting) == {r: n for r, n in nodes.items() if n.clauses or n.blocked}
    # a collective's recorded seq is its position (a group created again after
    # destroy_process_group numbers its collectives from 0 again: then below it)
    for gid, slots in oracle.slots.items():
        for slot in slots:
            assert all(op.seq is None or op.seq <= slot.index for op in slot.ops.values()), (
                gid,
                slot,
            )
    expected = _report(session, whole)
    state = wait_for_state(wfg)
    # fed in pieces: the same graphs and report
    for rng in (None, random.Random(seed), random.Random(seed + 1)):
        graph = feed(session, rng).graph()
        assert {r: graph.timelines[r] for r in graph.timelines} == timelines
        assert matches(graph) == matches(oracle)
        assert wait_for_state(build_wait_for_graph(session, graph)) == state
        assert _report(session, graph) == expected
    # blocking calls fed one call each: the same graphs and report
    graph = feed_calls(session).graph()
    assert {r: graph.timelines[r] for r in graph.timelines} == timelines
    assert matches(graph) == matches(oracle)
    assert wait_for_state(build_wait_for_graph(session, graph)) == state
    assert _report(session, graph) == expected
    # folded as soon as possible: the same verdict on the blocked ranks
    folded = feed(session, random.Random(seed + 2), window=0).graph()
    folded_wfg = build_wait_for_graph(session, folded)
    assert folded_wfg.deadlocked == wfg.deadlocked
    assert folded_wfg.shortest_cycle() == wfg.shortest_cycle()
    assert dict(folded_wfg.waiting) == dict(wfg.waiting)
    report = _report(session, folded)
    kept = _windowed(expected.findings)
    assert _windowed(report.findings) == kept
    if len(kept) == len(expected.findings):
        assert report.verdict == expected.verdict
    if wfg.deadlocked:
        check_resumed(session, wfg, expected)


def _windowed(findings: Any) -> list[Any]:
    """The findings a folded model gives too: those that need the whole history left
    out, and the whole-history sentence of a missing collective's message cut."""
    return [
        replace(f, message=f.message.split(SHIFT_SENTENCE, 1)[0])
        for f in findings
        if f.kind not in WHOLE_HISTORY
    ]


def cuts(length: int) -> set[int]:
    """Where to cut a trace of ``length`` records for a checkpoint."""
    return {c for c in (1, length // 3, length // 2, 2 * length // 3, length - 1) if 0 < c < length}


def _waits_again(records: Any) -> bool:
    """Whether a rank waits on a send or receive a second time (after a wait on it
    returned)."""
    p2p: set[int] = set()
    returned: set[int] = set()
    waits: dict[int, int] = {}
    for r in records:
        if isinstance(r, OpRecord) and r.op in P2P_OPS:
            p2p.add(r.id)
        elif isinstance(r, WaitRecord):
            if r.work in returned and r.work in p2p:
                return True
            waits[r.id] = r.work
        elif isinstance(r, RetRecord) and r.id in waits:
            returned.add(waits.pop(r.id))
    return False


def check_resumed(session: Session, wfg: WaitForGraph, expected: Report) -> None:
    """Any one rank resumed from a checkpoint: the same deadlock, lines and verdict.

    Not for a session with store calls: a checkpoint does not carry the store keys set
    before it, so the model claims no store wait of a resumed session (any key may have
    been set); see :meth:`dl2.model.execution_graph.ExecutionGraph.store_key_may_exist`.
    Nor for one where a rank waits on a send or receive a second time: a checkpoint
    carries the open ops only, so a model resumed from one written between the two
    waits does not know that the second waits on a send or receive, whose second wait
    never returns on gloo; see ``RankModel.blocked``.
    """
    if any(isinstance(r, StoreRecord) for t in session.traces.values() for r in t.records):
        return
    if any(_waits_again(t.records) for t in session.traces.values()):
        return
    deadlock = [f for f in expected.findings if f.kind in DEADLOCK_KINDS]
    for rank, trace in session.traces.items():
        for cut in sorted(cuts(len(trace.records))):
            cut_session = resumed(session, rank, cut)
            if cut_session is None:
                continue
            graph = build_execution_graph(cut_session)
            assert graph.resumed == {rank}
            found = build_wait_for_graph(cut_session, graph)
            assert found.deadlocked == wfg.deadlocked, (rank, cut)
            assert found.shortest_cycle() == wfg.shortest_cycle(), (rank, cut)
            report = _report(cut_session, graph)
            assert [f for f in report.findings if f.kind in DEADLOCK_KINDS] == deadlock
            assert report.verdict == expected.verdict, (rank, cut)
