"""The Chrome trace event format of a run, for ui.perfetto.dev and chrome://tracing.

:func:`perfetto_trace` turns a session, its execution graph and its report into the
JSON object of the trace event format: one process per rank (``pid`` = rank) with one
thread per thread that issued communication; each call (op record to its ``ret``) and
each wait on a work (wait record to its ``ret``) as a complete slice (``"X"``) with the
op's arguments; a call or wait that never returned runs to the end of the trace; flow
arrows (flow v2: ``bind_id`` with ``flow_in``/``flow_out`` on the slices) chain the
slices of every matched P2P pair and of every collective instance, as the model matched
them; each finding is an instant event (``"i"``) on every rank it concerns.

Timestamps are microseconds from the earliest record of the run; ranks are aligned on
their headers' wall clock (``wall`` at ``t0``).  The work is linear in the number of
records: :func:`iter_events` yields the events one by one and :func:`write_trace` writes
them without holding the JSON text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from itertools import pairwise
from typing import IO
from typing import Any

from dl2.model.execution_graph import ExecutionGraph
from dl2.model.ops import Op
from dl2.report import Finding
from dl2.report import Report
from dl2.trace.schema.decode import CheckpointRecord
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import StoreRecord
from dl2.trace.schema.decode import WaitRecord
from dl2.trace.session import Session

#: the category of every event dl2 writes
CATEGORY = "dl2"
#: the ``thread_name`` of the thread that issued a rank's first op
MAIN_THREAD = "main thread"
#: tids a rank's threads take (``rank * THREADS_PER_RANK + 1`` onwards)
THREADS_PER_RANK = 1000


@dataclass
class _Slice:
    """One call or wait of a rank, as it goes into the trace."""

    tid: int
    start: int  # ns from the origin
    end: int | None  # None: never returned (runs to the end of the trace)
    name: str
    op_id: int
    waits: bool  # a wait on the work of op ``op_id``, not the call itself
    bind: int | None = None
    flow_in: bool = False
    flow_out: bool = False


@dataclass
class _Rank:
    """What one rank's records say of its calls, in file order."""

    rank: int
    pid: int
    host: str
    slices: list[_Slice] = field(default_factory=list)
    #: the thread ident the records carry -> its track's tid, in order of first use
    tids: dict[int, int] = field(default_factory=dict)
    last: int = 0  # ns from the origin of its latest record
    main: dict[int, int] = field(default_factory=dict)  # op id -> index of its slice


def _offset(session: Session) -> dict[int, int]:
    """rank -> what to add to its monotonic ``t`` for a common clock (wall ns)."""
    return {r: t.header.wall - t.header.t0 for r, t in session.traces.items()}


def _read_rank(rank: int, session: Session, offset: int) -> _Rank:
    trace = session.traces[rank]
    header = trace.header
    out = _Rank(rank, header.pid, header.host)
    open_: dict[int, int] = {}  # call or wait id -> index in out.slices

    def track(ident: int) -> int:
        tid = out.tids.get(ident)
        if tid is None:
            tid = out.tids[ident] = _tid(rank, len(out.tids))
        return tid

    last = header.t0 + offset if header.t0 else 0
    for rec in _records(trace.records):
        t = getattr(rec, "t", 0)
        if t:
            last = max(last, t + offset)
        if isinstance(rec, OpRecord | StoreRecord):
            if isinstance(rec, StoreRecord) and not rec.block:
                continue
            name = rec.op if isinstance(rec, OpRecord) else f"store_{rec.op}"
            open_[rec.id] = len(out.slices)
            out.main[rec.id] = len(out.slices)
            out.slices.append(_Slice(track(rec.tid), t + offset, None, name, rec.id, False))
        elif isinstance(rec, WaitRecord):
            call = out.main.get(rec.work)
            name = "wait " + (out.slices[call].name if call is not None else "?")
            open_[rec.id] = len(out.slices)
            out.main[rec.work] = len(out.slices)  # the wait is where the op completes
            out.slices.append(_Slice(track(rec.tid), t + offset, None, name, rec.work, True))
        elif isinstance(rec, RetRecord):
            index = open_.pop(rec.id, None)
            if index is not None:
                out.slices[index].end = t + offset
    out.last = last
    return out


def _tid(rank: int, index: int) -> int:
    """The tid of a rank's ``index``-th thread: the trace processor reads tids as 32-bit
    unsigned numbers (a Python thread ident is a 64-bit address), and 0 is its idle
    thread; distinct across ranks, so that no two ranks' threads are ever taken as one."""
    return rank * THREADS_PER_RANK + index + 1


def _records(records: Iterable[object]) -> Iterator[object]:
    """The records, with a checkpoint's open calls and waits in its place."""
    for rec in records:
        if isinstance(rec, CheckpointRecord):
            yield from rec.open
            yield from rec.waits
            yield from rec.stores
        else:
            yield rec


def _op_args(op: Op | None, slice_: _Slice, blocked: bool) -> dict[str, Any]:
    args: dict[str, Any] = {"op_id": slice_.op_id}
    if op is None:
        return args
    args["group"] = op.gid
    for name in ("seq", "api", "peer", "root", "tag", "redop", "dtype", "count", "src"):
        value = getattr(op, name)
        if value is not None:
            args[name] = value
    if op.splits is not None:
        args["splits"] = [list(s) for s in op.splits]
    if op.keys is not None:
        args["keys"] = list(op.keys)
    if op.is_async:
        args["async"] = True
    frame = op.frame
    if frame is not None:
        args["source"] = f"{frame.file}:{frame.line}"
        args["function"] = frame.function
    if op.error is not None:
        status = "failed"
        args["error"] = op.error
    elif blocked:
        status = "blocked"
    elif op.completed:
        status = "completed"
    else:
        status = "issued" if op.issued else "not returned"
    args["status"] = status
    return args


def _link(ranks: dict[int, _Rank], ops: Iterable[Op], bind: int) -> int:
    """Chain the main slices of these ops in order of start with flow id ``bind``;
    returns the number of arrows (one fewer than the slices found)."""
    ends = []
    for op in ops:
        r = ranks.get(op.rank)
        index = r.main.get(op.id) if r is not None else None
        if r is not None and index is not None:
            ends.append((r.slices[index].start, op.rank, r.slices[index]))
    ends.sort(key=lambda e: (e[0], e[1]))
    if len(ends) < 2:
        return 0
    for i, (_, _, s) in enumerate(ends):
        s.bind = bind
        s.flow_in = i > 0
        s.flow_out = i < len(ends) - 1
    return len(ends) - 1


def _bind_flows(graph: ExecutionGraph, ranks: dict[int, _Rank]) -> int:
    """Give flow ids to the slices of matched pairs and collective instances."""
    bind = 0
    for gid in graph.slots:
        for slot in graph.slots[gid]:
            bind += 1
            if not _link(ranks, slot.ops.values(), bind):
                bind -= 1
    for rank in graph.traced:
        for op in graph.p2p_ops(rank):
            if op.op != "send":
                continue
            partner = graph.p2p_partner.get((op.rank, op.id))
            if partner is not None:
                bind += 1
                if not _link(ranks, (op, partner), bind):
                    bind -= 1
    return bind


def _clamp(slices: list[_Slice], end: int) -> None:
    """Make each thread's slices nest: a slice open past the next one's start on its
    thread (a call that never returned, met again) stops there."""
    by_tid: dict[int, list[_Slice]] = {}
    for s in slices:
        by_tid.setdefault(s.tid, []).append(s)
    for row in by_tid.values():
        row.sort(key=lambda s: s.start)
        for before, after in pairwise(row):
            if before.end is None or before.end > after.start:
                before.end = max(before.start, after.start)
        if row and row[-1].end is None:
            row[-1].end = max(row[-1].start, end)


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def _last_calls(ranks: dict[int, _Rank]) -> dict[tuple[int, str], int]:
    """(rank, op) -> the start of the rank's last call of that op."""
    return {(r.rank, s.name): s.start for r in ranks.values() for s in r.slices if not s.waits}


def _finding_ts(
    finding: Finding, rank: int, last_calls: dict[tuple[int, str], int], end: int
) -> int:
    """When to mark a finding on a rank: the start of the rank's last call of the op the
    finding names there, else the end of the trace."""
    for ref in finding.ops:
        if ref.rank == rank and (rank, ref.op) in last_calls:
            return last_calls[(rank, ref.op)]
    return end


def iter_events(
    session: Session, graph: ExecutionGraph, report: Report
) -> Iterator[dict[str, Any]]:
    """The trace events of a run, metadata first, then each rank's slices in order."""
    offsets = _offset(session)
    ranks = {r: _read_rank(r, session, offsets[r]) for r in sorted(session.traces)}
    starts = [s.start for r in ranks.values() for s in r.slices]
    origin = min(starts, default=min((r.last for r in ranks.values()), default=0))
    end = max((r.last for r in ranks.values()), default=origin)
    for r in ranks.values():
        _clamp(r.slices, end)
    _bind_flows(graph, ranks)
    blocked_ops = {
        (rank, op.id)
        for rank in graph.traced
        if (stuck := graph.timelines[rank].blocked) is not None
        for op in stuck.ops
    }
    for r in ranks.values():
        name = f"rank {r.rank}" + (f" (pid {r.pid}" + (f" on {r.host})" if r.host else ")"))
        yield _meta("process_name", r.rank, _tid(r.rank, 0), {"name": name})
        yield _meta("process_sort_index", r.rank, _tid(r.rank, 0), {"sort_index": r.rank})
        for i, (ident, tid) in enumerate(r.tids.items()):
            label = MAIN_THREAD if i == 0 else f"thread {ident:#x}"
            yield _meta("thread_name", r.rank, tid, {"name": label})
    for r in ranks.values():
        timeline = graph.timelines.get(r.rank)
        by_id = timeline.by_id if timeline is not None else {}
        for s in r.slices:
            op = by_id.get(s.op_id)
            blocked = (r.rank, s.op_id) in blocked_ops and s.end == end
            event: dict[str, Any] = {
                "ph": "X",
                "cat": CATEGORY,
                "name": s.name,
                "pid": r.rank,
                "tid": s.tid,
                "ts": _us(s.start - origin),
                "dur": _us((s.end if s.end is not None else end) - s.start),
                "args": _op_args(op, s, blocked),
            }
            if s.bind is not None:
                event["bind_id"] = s.bind
                if s.flow_in:
                    event["flow_in"] = True
                if s.flow_out:
                    event["flow_out"] = True
            yield event
    last_calls = _last_calls(ranks) if report.findings else {}
    for finding in report.findings:
        args: dict[str, Any] = {"message": finding.message}
        if finding.hint:
            args["hint"] = finding.hint
        if finding.cycle:
            args["cycle"] = list(finding.cycle)
        for rank in finding.ranks:
            if rank not in ranks:
                continue
            yield {
                "ph": "i",
                "s": "p",
                "cat": CATEGORY,
                "name": finding.kind.value,
                "pid": rank,
                "tid": _tid(rank, 0),
                "ts": _us(_finding_ts(finding, rank, last_calls, end) - origin),
                "args": args,
            }


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def perfetto_trace(session: Session, graph: ExecutionGraph, report: Report) -> dict[str, Any]:
    """The trace event JSON object of a run (``traceEvents`` and metadata)."""
    return {
        "traceEvents": list(iter_events(session, graph, report)),
        "displayTimeUnit": "ms",
        "otherData": _other(session, report),
    }


def _other(session: Session, report: Report) -> dict[str, str]:
    return {
        "producer": "dl2",
        "verdict": report.verdict.value,
        "world_size": str(session.world_size),
        "run_dir": session.run_dir or "",
    }


def write_trace(session: Session, graph: ExecutionGraph, report: Report, out: IO[str]) -> int:
    """Write the trace event JSON object to ``out`` event by event; returns the number
    of events."""
    out.write('{"displayTimeUnit": "ms", "otherData": ')
    out.write(json.dumps(_other(session, report)))
    out.write(', "traceEvents": [\n')
    count = 0
    for event in iter_events(session, graph, report):
        if count:
            out.write(",\n")
        out.write(json.dumps(event, ensure_ascii=False))
        count += 1
    out.write("\n]}\n")
    return count
