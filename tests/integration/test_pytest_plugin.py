"""``pytest --dl2`` (the ``pytest11`` entry point ``dl2.pytest_plugin``) on tests that
start process groups: a deadlocked test fails within seconds with dl2's diagnosis, a
passing test passes, a test that starts none is untouched, and no rank is left behind.

The inner tests run in one pytest session in a subprocess, with a hard timeout; the
junit XML gives each one's outcome and failure message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from dl2.live.launcher import process_alive
from dl2.trace.format import TRACE_SUFFIX
from dl2.trace.format import read_trace_file

pytestmark = pytest.mark.timeout(240)

#: the inner tests: worker functions at module level (spawn pickles them by name)
TESTS = '''
import multiprocessing
import os
import socket
import subprocess
import sys

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
    _processes("spawn")


def test_fork_deadlock():
    _processes("fork")


def _processes(method):
    ctx = multiprocessing.get_context(method)
    port = _port()
    procs = [ctx.Process(target=_send_send, args=(r, port)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)


def test_no_process_group():
    assert "DL2_RUN_DIR" in os.environ  # the plugin's environment, and nothing else
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
class Inner:
    """One inner test: its outcome, failure message, call span and run directory."""

    outcome: str  # "passed" or "failed"
    message: str
    start: float
    stop: float
    run_dir: Path | None


@dataclass(frozen=True)
class Session:
    output: str
    tests: dict[str, Inner]
    runs: Path


def _run_inner(where: Path, source: str, *args: str) -> Session:
    (where / "test_jobs.py").write_text(source)
    (where / "conftest.py").write_text(CONFTEST)
    runs, times, xml = where / "runs", where / "calls.jsonl", where / "junit.xml"
    env = dict(os.environ, OMP_NUM_THREADS="1", CALL_TIMES=str(times))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--dl2", f"--dl2-dir={runs}", f"--junitxml={xml}",
         "-p", "no:cacheprovider", "-q", *args],
        cwd=where, env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert xml.exists(), output
    spans = {}
    for line in times.read_text().splitlines():
        name, start, stop = json.loads(line)
        spans[name] = (start, stop)
    dirs = {d.name.split("-", 2)[2]: d for d in runs.glob("pytest-*/*") if d.is_dir()}
    tests = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.attrib["name"]
        failure = case.find("failure")
        message = "" if failure is None else (failure.text or "")
        tests[name] = Inner(
            "passed" if failure is None and case.find("error") is None else "failed",
            message, *spans[name], dirs.get(name),
        )  # fmt: skip
    return Session(output, tests, runs)


@pytest.fixture(scope="module")
def inner(tmp_path_factory: pytest.TempPathFactory) -> Session:
    """Every inner test, in one session."""
    return _run_inner(tmp_path_factory.mktemp("inner"), TESTS)


def _failed_within(test: Inner, seconds: float) -> None:
    """The test failed within ``seconds`` of its ranks' start (their first record: a
    loaded machine can take longer than that to start Python and import torch, which is
    not dl2's doing; the test's whole call is printed too)."""
    assert test.run_dir is not None
    files = test.run_dir.glob("*" + TRACE_SUFFIX)
    started = min(read_trace_file(str(f)).header.wall for f in files) / 1e9
    took = test.stop - started
    assert took < seconds, (
        f"failed {took:.1f} s after the ranks started ({test.stop - test.start:.1f} s call)"
    )


def _rank_pids(run_dir: Path | None) -> list[int]:
    assert run_dir is not None
    return [read_trace_file(str(f)).header.pid for f in run_dir.glob("*" + TRACE_SUFFIX)]


def _stopped(test: Inner) -> None:
    """dl2 recorded two ranks and none of them is left running."""
    pids = _rank_pids(test.run_dir)
    assert len(pids) >= 2 and not any(process_alive(p) for p in pids)


def test_spawned_deadlock_fails_fast_with_the_cycle(inner: Session) -> None:
    test = inner.tests["test_spawn_deadlock"]
    assert test.outcome == "failed"
    assert test.message.startswith("dl2: deadlock proven while the test ran")
    assert "rank 0 send→1 (test_jobs.py:" in test.message
    assert "rank 1 send→0 (test_jobs.py:" in test.message
    assert test.run_dir is not None
    report = json.loads((test.run_dir / "report.json").read_text())
    assert report["verdict"] == "deadlock"
    assert f"dl2 report: {test.run_dir / 'report.json'}" in test.message
    assert "ProcessExitedException" in test.message  # mp.spawn raised, not hung
    _stopped(test)
    _failed_within(test, 10)


def test_passing_test_passes_recorded(inner: Session) -> None:
    test = inner.tests["test_spawn_passes"]
    assert test.outcome == "passed", test.message
    assert len(_rank_pids(test.run_dir)) == 2  # recorded, not stopped
    assert test.run_dir is not None and not (test.run_dir / "report.json").exists()


def test_test_without_process_group_is_untouched(inner: Session) -> None:
    test = inner.tests["test_no_process_group"]
    assert test.outcome == "passed", test.message
    assert test.run_dir is None  # nothing recorded, nothing left


def test_multiprocessing_deadlock_fails(inner: Session) -> None:
    test = inner.tests["test_multiprocessing_deadlock"]
    assert test.outcome == "failed"
    assert "DEADLOCK: 2 ranks wait on each other forever" in test.message
    _stopped(test)
    _failed_within(test, 10)


def test_forked_deadlock_fails(inner: Session) -> None:
    """Ranks forked from the pytest process: the at-fork hook records them."""
    test = inner.tests["test_fork_deadlock"]
    assert test.outcome == "failed"
    assert "rank 0 send→1 (test_jobs.py:" in test.message
    _stopped(test)
    _failed_within(test, 10)


def test_torchrun_subprocess_deadlock_fails(inner: Session) -> None:
    test = inner.tests["test_torchrun_deadlock"]
    assert test.outcome == "failed"
    assert "rank 0 send→1 (job.py:7)" in test.message
    assert "rank 1 send→0 (job.py:7)" in test.message
    assert "CalledProcessError" in test.message  # torchrun exited, not hung
    _stopped(test)
    _failed_within(test, 10)


def test_session_without_process_groups_leaves_no_directory(tmp_path: Path) -> None:
    session = _run_inner(tmp_path, "def test_plain():\n    assert sum(range(4)) == 6\n")
    assert session.tests["test_plain"].outcome == "passed"
    assert "dl2" not in session.output.replace("--dl2", "")
    assert not session.runs.exists()  # made for the test, removed with it


def test_plugin_is_registered_by_its_entry_point() -> None:
    from importlib.metadata import entry_points

    (point,) = [e for e in entry_points(group="pytest11") if e.name == "dl2"]
    assert point.value == "dl2.pytest_plugin"
    assert sys.modules.get("dl2.pytest_plugin") is not None  # loaded in this very run
