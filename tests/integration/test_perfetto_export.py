"""`dl2 export --perfetto` of recorded DDP and pipeline jobs: the trace loads, with one
slice per call and per wait and one arrow per matched pair or collective instance."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from test_online import dl2_run

from dl2.trace.session import load_session
from perfetto_check import check_trace
from perfetto_check import trace_processor_counts

CASES = Path(__file__).resolve().parent / "record_cases"
pytestmark = pytest.mark.timeout(240)


def _record_and_export(dl2_bin: Path, tmp: Path, case: str, arg: str) -> tuple[Path, Path]:
    # (dl2_run runs the job once more if torch aborted a rank at teardown)
    args = ["--hang-timeout", "60", "-n", "2", str(CASES / f"case_{case}.py"), arg]
    run = dl2_run(dl2_bin, tmp / case, args, timeout=180)
    assert run.returncode == 0, run.output
    out = tmp / f"{case}.json"
    export = [str(dl2_bin), "export", str(run.run_dir), "--perfetto", str(out)]
    done = subprocess.run(export, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return run.run_dir, out


def _recorded_ops(run_dir: Path) -> Counter[tuple[int, str]]:
    """(rank, op) -> how many op records the rank's trace holds."""
    session = load_session(run_dir)
    return Counter(
        (rank, rec.op)
        for rank, trace in session.traces.items()
        for rec in trace.records
        if rec.kind == "op"
    )


@pytest.fixture(scope="module")
def ddp(dl2_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _record_and_export(dl2_bin, tmp_path_factory.mktemp("ddp"), "ddp", "3")


@pytest.fixture(scope="module")
def pipeline(dl2_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _record_and_export(dl2_bin, tmp_path_factory.mktemp("pp"), "pipeline", "4")


def test_ddp_export(ddp: tuple[Path, Path]) -> None:
    run_dir, out = ddp
    trace = json.loads(out.read_text())
    counts = check_trace(trace)
    ops = _recorded_ops(run_dir)
    collectives = [n for (r, o), n in ops.items() if r == 0 and o != "create_group"]
    assert ops[(0, "all_reduce")] == 3  # one gradient bucket per step
    assert {o: n for (r, o), n in ops.items() if r == 1} == {
        o: n for (r, o), n in ops.items() if r == 0
    }
    assert counts.flows == sum(collectives)  # 2 ranks: one arrow per collective instance
    assert counts.instants == 0  # a clean run has no finding
    assert counts.processes == 2
    names = Counter(e["name"] for e in trace["traceEvents"] if e["ph"] == "X")
    assert names["all_reduce"] == 6


def test_pipeline_export(pipeline: tuple[Path, Path]) -> None:
    run_dir, out = pipeline
    trace = json.loads(out.read_text())
    counts = check_trace(trace)
    ops = _recorded_ops(run_dir)
    assert ops[(0, "send")] == ops[(1, "recv")] == ops[(1, "send")] == ops[(0, "recv")] == 4
    assert counts.flows == 8  # 4 activations forward, 4 gradients back
    events = trace["traceEvents"]
    bound = Counter(e["bind_id"] for e in events if "bind_id" in e)
    assert len(bound) == 8 and set(bound.values()) == {2}  # each arrow joins a send and a recv
    pairs = {}
    for e in events:
        if "bind_id" in e:
            pairs.setdefault(e["bind_id"], set()).add((e["pid"], e["name"]))
    assert all(
        p in ({(0, "wait send"), (1, "wait recv")}, {(1, "wait send"), (0, "wait recv")})
        for p in pairs.values()
    )


@pytest.mark.parametrize("job", ["ddp", "pipeline"])
def test_trace_processor_loads_the_export(job: str, request: pytest.FixtureRequest) -> None:
    _, out = request.getfixturevalue(job)
    counts = check_trace(json.loads(out.read_text()))
    assert trace_processor_counts(str(out)) == {
        "slices": counts.slices,
        "flows": counts.flows,
        "processes": 2,
    }
