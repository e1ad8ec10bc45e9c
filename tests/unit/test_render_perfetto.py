"""The Perfetto / Chrome trace export (`dl2 export --perfetto`) of built traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dl2.analysis import analyze
from dl2.cli import main
from dl2.model.execution_graph import build_execution_graph
from dl2.render.perfetto import perfetto_trace
from perfetto_check import check_trace
from perfetto_check import trace_processor_counts
from trace_builders import RankBuilder
from trace_builders import ranks
from trace_builders import session
from trace_builders import write_run_dir


def _deadlock() -> list[RankBuilder]:
    """An all_reduce, a matched send/recv, then both ranks send: stuck."""
    r0, r1 = ranks(2)
    r0.call("all_reduce", 3)
    r1.call("all_reduce", 3)
    r0.call("send", 5, peer=1)
    r1.call("recv", 6, peer=0)
    r0.call("send", 9, peer=1, complete=False)
    r1.call("send", 9, peer=0, complete=False)
    return [r0, r1]


def _export(builders: list[RankBuilder]) -> dict[str, object]:
    s = session(builders)
    graph = build_execution_graph(s)
    return perfetto_trace(s, graph, analyze(s, graph=graph))


def test_slices_flows_and_findings_of_a_deadlock() -> None:
    trace = _export(_deadlock())
    counts = check_trace(trace)
    events = trace["traceEvents"]
    assert isinstance(events, list)
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == 12  # 3 calls and their 3 waits per rank
    assert counts.flows == 2  # the all_reduce instance and the send/recv pair
    assert counts.processes == 2 and counts.threads == 2
    instants = [e for e in events if e["ph"] == "i"]
    assert {e["pid"] for e in instants if e["name"] == "deadlock"} == {0, 1}
    deadlock = next(e for e in instants if e["name"] == "deadlock")
    assert deadlock["args"]["cycle"] == [0, 1]
    end = max(e["ts"] + e["dur"] for e in xs)
    stuck = [e for e in xs if e["args"].get("status") == "blocked" and e["name"] == "wait send"]
    assert {e["pid"] for e in stuck} == {0, 1}
    assert all(e["ts"] + e["dur"] == pytest.approx(end) for e in stuck)


def test_slice_arguments_name_the_op_and_its_line() -> None:
    trace = _export(_deadlock())
    events = trace["traceEvents"]
    assert isinstance(events, list)
    send = next(e for e in events if e["name"] == "send" and e["pid"] == 0)
    assert send["args"] == {
        "op_id": send["args"]["op_id"],
        "group": "0",
        "seq": 0,
        "api": "send",
        "peer": 1,
        "tag": 0,
        "dtype": "float32",
        "count": 4,
        "source": "train.py:5",
        "function": "main",
        "status": "completed",
    }
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == [0, 1]
    assert all(name.startswith(f"rank {pid} ") for pid, name in names.items())


def test_flows_link_the_model_matches_not_the_order() -> None:
    """A wildcard receive: the arrow goes to the sender the model matched (rank 2)."""
    r0, r1, r2 = ranks(3)
    recv = r0.irecv(4, None)
    r0.wait(recv, src=2)
    r2.call("send", 7, peer=0)
    r1.call("barrier", 8, complete=False)
    trace = _export([r0, r1, r2])
    counts = check_trace(trace)
    assert counts.flows == 1
    events = trace["traceEvents"]
    assert isinstance(events, list)
    bound = {e["pid"] for e in events if "bind_id" in e}
    assert bound == {0, 2}


def test_cli_writes_the_trace_and_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run_dir(_deadlock(), tmp_path / "run")
    out = tmp_path / "trace.json"
    assert main(["export", str(run), "--perfetto", str(out)]) == 0
    check_trace(json.loads(out.read_text()))
    capsys.readouterr()
    assert main(["export", str(tmp_path / "nothing"), "--perfetto", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dl2: ") and err.count("\n") == 1
    assert main(["export", str(run), "--perfetto", str(tmp_path / "no" / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dl2: cannot write") and err.count("\n") == 1


def test_trace_processor_loads_the_export(tmp_path: Path) -> None:
    trace = _export(_deadlock())
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    counts = check_trace(trace)
    assert trace_processor_counts(str(path)) == {
        "slices": counts.slices,
        "flows": counts.flows,
        "processes": 2,
    }


def test_each_thread_gets_a_track_with_a_32_bit_tid() -> None:
    """A work waited on by another thread: two tracks on the rank, tids the trace
    processor can read (the records carry 64-bit thread idents)."""
    r0, r1 = ranks(2)
    op = r0.isend(3, peer=1)
    wait_id = 99
    r0.encoder.wait(wait_id, r0._time(), 140497836292992, op, 0)
    r0.ret(wait_id)
    r1.call("recv", 4, peer=0)
    trace = _export([r0, r1])
    counts = check_trace(trace)
    assert counts.threads == 3 and counts.flows == 1
    events = trace["traceEvents"]
    assert isinstance(events, list)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {
        (0, 1): "main thread",
        (0, 2): "thread 0x7fc8339fbb80",
        (1, 1001): "main thread",
    }
    wait = next(e for e in events if e["name"] == "wait send")
    assert wait["tid"] == 2 and wait["bind_id"] and wait["flow_out"]
