"""``pytest --dl2`` (the ``pytest11`` entry point ``dl2.pytest_plugin``) on tests that
start process groups: a deadlocked test fails within seconds with dl2's diagnosis, a
passing test passes, a test that starts none is untouched, and no rank is left behind.

Each case runs an inner pytest in a subprocess (pytester), with a hard timeout.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dl2.live.launcher import process_alive
from dl2.trace.format import TRACE_SUFFIX
from dl2.trace.format import read_trace_file

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.timeout(240)

#: the inner tests: worker functions at module level (spawn pickles them by name)
TESTS = '''
import socket
import subprocess
import sys
import multiprocessing

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank, port):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )


def _send_send(rank, port):
    _init(rank, port)
    t = torch.ones(4)
    dist.send(t, 1 - rank)  # both ranks send first
    dist.recv(t, 1 - rank)
    dist.destroy_process_group()


def _all_reduce(rank, port):
    _init(rank, port)
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0] == 2
    dist.destroy_process_group()


def test_spawn_deadlock():
    mp.spawn(_send_send, args=(_port(),), nprocs=2)


def test_spawn_passes():
    mp.spawn(_all_reduce, args=(_port(),), nprocs=2)


def test_multiprocessing_deadlock():
    ctx = multiprocessing.get_context("spawn")
    port = _port()
    procs = [ctx.Process(target=_send_send, args=(r, port)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)


def test_no_process_group(tmp_path):
    assert sum(range(4)) == 6


TORCHRUN_JOB = """
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
peer = 1 - dist.get_rank()
dist.send(t, peer)  # both ranks send first
dist.recv(t, peer)
"""


def test_torchrun_deadlock(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(TORCHRUN_JOB)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", str(job)]
    subprocess.run(cmd, check=True, timeout=100, capture_output=True)
'''


#: the harness's own conftest (not the tests'): when each test's call began and ended
CONFTEST = """
import json, os

def pytest_runtest_logreport(report):
    if report.when == "call":
        with open(os.environ["CALL_TIMES"], "a") as f:
            f.write(json.dumps([report.nodeid.split("::")[-1], report.start, report.stop]) + "\\n")
"""


@dataclass(frozen=True)
class Call:
    """A test call's wall-clock span (``time.time()``)."""

    start: float
    stop: float


def _run(pytester: pytest.Pytester, *select: str) -> tuple[pytest.RunResult, dict[str, Call], Path]:
    pytester.makepyfile(test_jobs=TESTS)
    pytester.makeconftest(CONFTEST)
    runs, times = pytester.path / "runs", pytester.path / "calls.jsonl"
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["CALL_TIMES"] = str(times)
    result = pytester.runpytest_subprocess(
        "--dl2", f"--dl2-dir={runs}", "-p", "no:cacheprovider", "-k", " or ".join(select),
        timeout=200,
    )  # fmt: skip
    calls = {}
    for line in times.read_text().splitlines():
        name, start, stop = json.loads(line)
        calls[name] = Call(start, stop)
    return result, calls, runs


def _failed_within(call: Call, run_dir: Path, seconds: float) -> None:
    """The test failed within ``seconds`` of its ranks' start (their first record: a
    loaded machine can take longer than that to start Python and import torch, which is
    not dl2's doing; the test's whole call is printed too)."""
    started = min(read_trace_file(str(f)).header.wall for f in run_dir.glob("*" + TRACE_SUFFIX))
    took = call.stop - started / 1e9
    assert took < seconds, (
        f"failed {took:.1f} s after the ranks started ({call.stop - call.start:.1f} s call)"
    )


def _run_dirs(runs: Path) -> dict[str, Path]:
    """test name -> its run directory (named <time>-<test>)."""
    return {d.name.split("-", 2)[2]: d for d in runs.glob("pytest-*/*") if d.is_dir()}


def _rank_pids(run_dir: Path) -> list[int]:
    return [read_trace_file(str(f)).header.pid for f in run_dir.glob("*" + TRACE_SUFFIX)]


def test_spawned_deadlock_fails_fast_with_the_cycle(pytester: pytest.Pytester) -> None:
    result, calls, runs = _run(pytester, "test_spawn_deadlock")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "dl2: deadlock proven while the test ran" in out
    assert "rank 0 send→1 (test_jobs.py:" in out and "rank 1 send→0 (test_jobs.py:" in out
    run_dir = _run_dirs(runs)["test_spawn_deadlock"]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"] == "deadlock"
    assert f"dl2 report: {run_dir / 'report.json'}" in out
    pids = _rank_pids(run_dir)
    assert len(pids) == 2 and not any(process_alive(p) for p in pids)
    _failed_within(calls["test_spawn_deadlock"], run_dir, 10)


def test_passing_and_untouched_tests(pytester: pytest.Pytester) -> None:
    result, _, runs = _run(pytester, "test_spawn_passes", "test_no_process_group")
    result.assert_outcomes(passed=2)
    assert "dl2:" not in result.stdout.str() and "dl2 report" not in result.stdout.str()
    dirs = _run_dirs(runs)
    assert "test_no_process_group" not in dirs  # nothing recorded, nothing left
    assert len(_rank_pids(dirs["test_spawn_passes"])) == 2  # recorded, not stopped
    assert not (dirs["test_spawn_passes"] / "report.json").exists()


def test_untouched_test_leaves_no_directory(pytester: pytest.Pytester) -> None:
    result, _, runs = _run(pytester, "test_no_process_group")
    result.assert_outcomes(passed=1)
    assert not runs.exists()  # made for the test, removed with it: nothing was recorded


def test_multiprocessing_deadlock_fails(pytester: pytest.Pytester) -> None:
    result, calls, runs = _run(pytester, "test_multiprocessing_deadlock")
    result.assert_outcomes(failed=1)
    assert "DEADLOCK: 2 ranks wait on each other forever" in result.stdout.str()
    run_dir = _run_dirs(runs)["test_multiprocessing_deadlock"]
    pids = _rank_pids(run_dir)
    assert len(pids) == 2 and not any(process_alive(p) for p in pids)
    _failed_within(calls["test_multiprocessing_deadlock"], run_dir, 10)


def test_torchrun_subprocess_deadlock_fails(pytester: pytest.Pytester) -> None:
    result, calls, runs = _run(pytester, "test_torchrun_deadlock")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "rank 0 send→1 (job.py:7)" in out and "rank 1 send→0 (job.py:7)" in out
    run_dir = _run_dirs(runs)["test_torchrun_deadlock"]
    pids = _rank_pids(run_dir)
    assert len(pids) >= 2 and not any(process_alive(p) for p in pids)
    _failed_within(calls["test_torchrun_deadlock"], run_dir, 10)


def test_plugin_is_registered_by_its_entry_point() -> None:
    from importlib.metadata import entry_points

    (point,) = [e for e in entry_points(group="pytest11") if e.name == "dl2"]
    assert point.value == "dl2.pytest_plugin"
    assert sys.modules.get("dl2.pytest_plugin") is not None  # loaded in this very run
