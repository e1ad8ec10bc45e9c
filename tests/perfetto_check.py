"""Checks of `dl2 export --perfetto` output: a strict check of the trace event format
and, where a ``trace_processor_shell`` binary is at hand, Perfetto's own trace processor.

The ``perfetto`` package downloads that binary on first use, which an offline machine
cannot: ``DL2_TRACE_PROCESSOR`` names one; without it the trace-processor tests skip.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest

PHASES = {"X", "M", "i"}
METADATA = {"process_name", "process_sort_index", "thread_name"}


@dataclass(frozen=True)
class Counts:
    """What a trace holds: slices (complete and instant), arrows, tracks."""

    slices: int
    instants: int
    flows: int
    processes: int
    threads: int


def _number(event: dict[str, Any], key: str) -> float:
    value = event[key]
    assert isinstance(value, int | float) and not isinstance(value, bool), (key, event)
    assert value >= 0, (key, event)
    return float(value)


def check_trace(trace: dict[str, Any]) -> Counts:
    """Validate every event strictly; return the counts the trace processor would see.

    Flows (v2): a ``bind_id`` chains slices in order of start; each ``flow_in`` ends one
    arrow begun by an earlier slice's ``flow_out`` with that id (the trace processor
    drops an arrow whose end it meets before its start).
    """
    assert set(trace) >= {"traceEvents"}
    events = trace["traceEvents"]
    assert isinstance(events, list)
    named: dict[tuple[int, int], str] = {}
    processes: set[int] = set()
    open_flows: Counter[int] = Counter()
    flows = slices = instants = 0
    per_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    xs = []
    for event in events:
        assert event["ph"] in PHASES, event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int), event
        # the trace processor reads both as 32-bit unsigned numbers; tid 0 is its idle thread
        assert 0 <= event["pid"] < 1 << 32 and 0 < event["tid"] < 1 << 32, event
        assert isinstance(event["name"], str) and event["name"], event
        if event["ph"] == "M":
            assert event["name"] in METADATA, event
            assert set(event) == {"ph", "name", "pid", "tid", "args"}, event
            if event["name"] == "process_name":
                processes.add(event["pid"])
            if event["name"] == "thread_name":
                named[(event["pid"], event["tid"])] = event["args"]["name"]
            continue
        assert event["cat"] == "dl2" and isinstance(event["args"], dict), event
        ts = _number(event, "ts")
        if event["ph"] == "i":
            assert event["s"] in ("t", "p", "g"), event
            instants += 1
            continue
        dur = _number(event, "dur")
        slices += 1
        per_thread.setdefault((event["pid"], event["tid"]), []).append((ts, ts + dur))
        assert (event["pid"], event["tid"]) in named, f"no thread_name for {event}"
        xs.append(event)
    for rows in per_thread.values():  # slices of a thread must nest or follow each other
        rows.sort()
        for (s0, e0), (s1, e1) in pairwise(rows):
            assert e0 <= s1 + 1e-3 or e1 <= e0 + 1e-3, (s0, e0, s1, e1)
    for event in sorted(xs, key=lambda e: (e["ts"], e["pid"])):
        if "bind_id" not in event:
            assert "flow_in" not in event and "flow_out" not in event, event
            continue
        bind = event["bind_id"]
        if event.get("flow_in"):
            assert open_flows[bind] == 1, f"flow {bind} ends before it starts: {event}"
            open_flows[bind] -= 1
            flows += 1
        if event.get("flow_out"):
            open_flows[bind] += 1
    assert not +open_flows, f"flows never ended: {+open_flows}"
    return Counts(slices + instants, instants, flows, len(processes), len(named))


def trace_processor_path() -> str:
    """The trace_processor_shell to use, or skip the test."""
    path = os.environ.get("DL2_TRACE_PROCESSOR")
    if not path or not os.path.isfile(path):
        pytest.skip(
            "Perfetto's trace processor needs a trace_processor_shell binary, which the "
            "perfetto package downloads from outside the package registries; set "
            "DL2_TRACE_PROCESSOR to one to run this test"
        )
    return path


def trace_processor_counts(path: str) -> dict[str, int]:
    """Load the trace file in Perfetto's trace processor and count by SQL."""
    from perfetto.trace_processor import TraceProcessor
    from perfetto.trace_processor import TraceProcessorConfig

    config = TraceProcessorConfig(bin_path=trace_processor_path())
    with TraceProcessor(trace=path, config=config) as tp:

        def one(sql: str) -> int:
            return int(next(iter(tp.query(sql))).n)

        return {
            "slices": one("select count(*) as n from slice"),
            "flows": one("select count(*) as n from flow"),
            "processes": one("select count(*) as n from process where name like 'rank %'"),
        }
