"""The live monitor end to end: ``dl2 run`` on real gloo jobs.

* every deadlock category of ``cases/`` is proven live (run.json says "deadlock", not
  "hang-timeout") well before the hang timeout, and its correct twin exits 0;
* ``--on-deadlock report`` reports once and keeps the job, ``wait`` does not report;
* a rank computing in Python is a hang suspect, printed with its line, never a verdict;
* a rank killed by a signal orphans its peer's wait;
* two "nodes" on 127.0.0.1, each with its own ``dl2 run -- torchrun``: one verdict.

All runs start in one pool, a few at a time (the ``online`` fixture), to keep the
module's wall time small; each test then checks its runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_categories import CASES
from test_categories import Case

from ports import free_port
from teardown import torn_down

#: far above the observed verdict latency (about 0.5 s): a verdict must not come from it
HANG_TIMEOUT_S = 30
#: hard limit of one ``dl2 run``
RUN_TIMEOUT_S = 80
#: ``dl2 run`` processes at a time
PARALLEL = 3


@dataclass
class Run:
    returncode: int
    output: str
    run_dir: Path
    wall: float

    @property
    def meta(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "run.json").read_text())

    @property
    def report(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "report.json").read_text())


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def dl2_run(
    dl2_bin: Path,
    run_dir: Path,
    args: list[str],
    timeout: float = RUN_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> Run:
    """``dl2 run --run-dir RUN_DIR ARGS``, killed (with what it started) past ``timeout``
    (``env``: more environment variables for the run); run once more (in RUN_DIR-again)
    when torch aborted a rank at interpreter teardown after its work
    (:mod:`teardown`)."""
    run = _dl2_run_once(dl2_bin, run_dir, args, timeout, env)
    try:
        warnings = run.report.get("warnings", [])
    except (OSError, ValueError):
        warnings = []
    if torn_down(run.returncode, run.output, warnings):
        run = _dl2_run_once(dl2_bin, run_dir.with_name(f"{run_dir.name}-again"), args, timeout, env)
    return run


def _dl2_run_once(
    dl2_bin: Path,
    run_dir: Path,
    args: list[str],
    timeout: float,
    env: dict[str, str] | None,
) -> Run:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(dl2_bin), "run", "--run-dir", str(run_dir), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = -999
        finally:
            _kill_group(proc.pid)
            proc.wait()
    return Run(code, log.read_text(errors="replace"), run_dir, time.monotonic() - started)


def _leftovers(run_dir: Path) -> list[int]:
    """Rank processes named in the traces that still run."""
    alive = []
    for path in run_dir.glob("*.dl2.jsonl"):
        pid = int(json.loads(path.open().readline())["pid"])
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    alive.append(pid)
        except OSError:
            pass
    return alive


def _one_per_category(label: str) -> list[Case]:
    chosen: dict[str, Case] = {}
    for case in sorted(CASES, key=lambda c: (c.world, c.name)):
        if case.label == label:
            chosen.setdefault(case.category, case)
    return list(chosen.values())


DEADLOCKS = _one_per_category("deadlock")
TWINS = [
    twin
    for category in sorted({c.category for c in DEADLOCKS})
    for twin in _one_per_category("ok")
    if twin.category == category
]


@pytest.mark.timeout(400)
def test_every_deadlock_category_is_proven_live(online):
    assert len({c.category for c in DEADLOCKS}) >= 10
    failures = []
    for case in DEADLOCKS:
        run = online[case.name]
        meta = run.meta if (run.run_dir / "run.json").exists() else {}
        ok = (
            run.returncode == 3
            and meta.get("reason") == "deadlock"
            and meta.get("detected_after") is not None
            and meta["detected_after"] < HANG_TIMEOUT_S / 3
            and set(run.report["findings"][0]["ranks"]) == set(case.ranks)
            and not _leftovers(run.run_dir)
        )
        if not ok:
            failures.append(f"{case.name}: exit {run.returncode} {meta}\n{run.output[-1500:]}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.timeout(400)
def test_correct_twins_finish_under_the_live_monitor(online):
    failures = [
        f"{case.name}: exit {online[case.name].returncode}\n{online[case.name].output[-1500:]}"
        for case in TWINS
        if online[case.name].returncode != 0 or online[case.name].meta.get("reason") != "finished"
    ]
    assert not failures, "\n\n".join(failures)


# -- scripts written for these tests --------------------------------------------------------

SEND_SEND = """
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.send(torch.ones(4), dst=1 - rank)  # both ranks block here
"""

SLOW_RANK = """
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if dist.get_rank() == 1:
    time.sleep(6)  # the slow rank
dist.all_reduce(t)
dist.destroy_process_group()
"""

KILLED_RANK = """
import os
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if dist.get_rank() == 1:
    time.sleep(1.5)
    os.kill(os.getpid(), 9)
dist.recv(t, src=1)  # rank 0 waits on rank 1
"""


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def _line(path: Path, marker: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if marker in line)


@pytest.mark.timeout(400)
def test_modes_suspects_and_dead_ranks(online):
    runs = online  # by name
    slow = online["slow_rank.py"]
    killed = online["killed_rank.py"]
    # --on-deadlock report: one live report, the job kept until the hang timeout
    run = runs["report"]
    assert run.output.count("deadlock proven among ranks 0,1") == 1, run.output
    assert run.returncode == 3 and run.meta["reason"] == "hang-timeout", run.output
    assert run.output.count("DEADLOCK:") == 2, run.output  # the live report and the final one

    # --on-deadlock wait: no live report; the final report still names the deadlock
    run = runs["wait"]
    assert "deadlock proven" not in run.output, run.output
    assert run.returncode == 3 and run.meta["reason"] == "hang-timeout", run.output
    assert run.output.count("DEADLOCK:") == 1, run.output

    # a slow rank is a hang suspect with its line; the job completes
    run = runs["suspect"]
    sleep_line = _line(slow, "time.sleep(6)")
    suspects = [line for line in run.output.splitlines() if "hang suspect" in line]
    assert len(suspects) == 1, run.output
    assert "Rank 1" in suspects[0] and f"slow_rank.py:{sleep_line}" in suspects[0], run.output
    assert run.returncode == 0 and run.meta["reason"] == "finished", run.output

    # a killed rank: seen at once, its peer's wait is orphaned
    run = runs["killed"]
    # rank 0 fails on its own (gloo: connection closed) within the grace dl2 gives it, or
    # dl2 stops it: exit 1 (job failed), or 4 when the stopped rank had already written
    # its end record (the report's verdict rules count it as exited)
    assert run.meta["reason"] in ("finished", "rank-failed"), run.output
    assert run.returncode in (1, 4) and run.report["verdict"] != "deadlock", run.output
    assert run.wall < HANG_TIMEOUT_S, run.output
    orphaned = [f for f in run.report["findings"] if f["kind"] == "orphaned-wait"]
    assert orphaned and orphaned[0]["ranks"] == [0, 1], run.output
    assert orphaned[0]["ops"][0]["line"] == _line(killed, "rank 0 waits"), run.output
    assert not _leftovers(run.run_dir)


@pytest.mark.timeout(400)
def test_two_nodes_give_one_verdict(online, dl2_bin):
    # GIVEN a send/send deadlock with one rank on each of two "nodes", each node with
    # its own dl2 run around its own torchrun (see ``_two_nodes``)
    first, second = online["node0"], online["node1"]
    script = online["send_send.py"]
    # THEN both exit 3; the node of rank 0 reports, the other points at it
    assert (first.returncode, second.returncode) == (3, 3), first.output + second.output
    assert first.meta["reason"] == "deadlock", first.output
    assert second.meta["reason"] == "remote-verdict", second.output
    assert first.output.count("DEADLOCK:") == 1 and "DEADLOCK:" not in second.output
    assert "rank 0's node" in second.output and str(first.run_dir) in second.output
    line = _line(script, "both ranks block here")
    for run in (first, second):
        finding = run.report["findings"][0]
        assert finding["kind"] == "deadlock" and finding["ranks"] == [0, 1]
        assert {(op["rank"], op["line"]) for op in finding["ops"]} == {(0, line), (1, line)}
        assert not _leftovers(run.run_dir)
    # AND dl2 analyze of the reporting node's directory, which keeps the trace the other
    # node's monitor sent (mirrored/), gives the live verdict; the other node's points
    # at it
    assert list((first.run_dir / "mirrored").glob("rank00001.*")), first.output
    leader = _analyze(dl2_bin, first.run_dir)
    assert leader.returncode == 3, leader.stderr
    finding = json.loads(leader.stdout)["findings"][0]
    assert finding["kind"] == "deadlock" and finding["ranks"] == [0, 1], leader.stdout
    assert {(op["rank"], op["line"]) for op in finding["ops"]} == {(0, line), (1, line)}
    follower = _analyze(dl2_bin, second.run_dir)
    assert str(first.run_dir) in " ".join(json.loads(follower.stdout)["warnings"]), follower


def _analyze(dl2_bin: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(dl2_bin), "analyze", "-r", "json", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _two_nodes(dl2_bin: Path, tmp_path: Path, script: Path) -> tuple[Run, Run]:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    port = free_port()

    def node(rank: int) -> Run:
        command = [torchrun, "--nnodes", "2", "--node-rank", str(rank)]
        command += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--nproc-per-node", "1", str(script)]
        return dl2_run(dl2_bin, tmp_path / f"node{rank}", ["--", *command])

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(node, [0, 1])
    return first, second


@pytest.fixture(scope="module")
def online(dl2_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every run of this module, started in one pool (a few at a time) for wall time.

    Keys: case names, "report", "wait", "suspect", "killed", "node0", "node1", and the
    scripts written for these tests by file name (as paths).
    """
    tmp_path = tmp_path_factory.mktemp("online")
    send_send = _script(tmp_path, "send_send.py", SEND_SEND)
    slow = _script(tmp_path, "slow_rank.py", SLOW_RANK)
    killed = _script(tmp_path, "killed_rank.py", KILLED_RANK)
    jobs: dict[str, list[str]] = {
        "report": ["--on-deadlock", "report", "--hang-timeout", "4", "-n", "2", str(send_send)],
        "wait": ["--on-deadlock", "wait", "--hang-timeout", "3", "-n", "2", str(send_send)],
        "suspect": ["--suspect-after", "2", "-n", "2", str(slow)],
        "killed": ["--hang-timeout", str(HANG_TIMEOUT_S), "-n", "2", str(killed)],
    }
    for case in [*DEADLOCKS, *TWINS]:
        jobs[case.name] = ["--hang-timeout", str(HANG_TIMEOUT_S), "-n", str(case.world)]
        jobs[case.name].append(str(case.path))
    results: dict[str, Any] = {p.name: p for p in (send_send, slow, killed)}
    with ThreadPoolExecutor(PARALLEL) as pool:
        nodes = pool.submit(_two_nodes, dl2_bin, tmp_path, send_send)
        futures = {k: pool.submit(dl2_run, dl2_bin, tmp_path / k, a) for k, a in jobs.items()}
        results.update({k: f.result() for k, f in futures.items()})
        results["node0"], results["node1"] = nodes.result()
    return results


ROTATING_SENDSEND = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
tensor = torch.ones(4)
for _ in range(1500):
    dist.all_reduce(tensor)
dist.send(torch.ones(8), dst=1 - rank)  # both ranks: send/send
"""


@pytest.mark.timeout(200)
def test_a_deadlock_after_rotated_segments_is_proven_live_on_its_line(
    dl2_bin, tmp_path, monkeypatch
):
    # GIVEN a job recorded in 4 KiB segments, 2 kept: its 1,500 all_reduces rotate its
    # trace many times before both ranks block in a send to the other
    script = tmp_path / "rotating.py"
    script.write_text(ROTATING_SENDSEND)
    monkeypatch.setenv("DL2_SEGMENT_BYTES", "4096")
    run = dl2_run(dl2_bin, tmp_path / "run", ["--keep", "2", "-n", "2", str(script)], 150)
    # THEN the live monitor proves the deadlock, at the send line, from rotated traces
    assert run.returncode == 3, run.output
    assert "DEADLOCK" in run.output and "rotating.py:10" in run.output, run.output
    for rank in (0, 1):
        files = sorted((tmp_path / "run").glob(f"rank{rank:05d}.*.dl2.jsonl"))
        assert len(files) == 2 and all(".s0" in f.name for f in files), files
