"""Verdicts of jobs that did not run to their end, each with its correct twin.

* a job whose own launcher kills it while two ranks wait in a broadcast whose root waits
  on a file nobody writes: ``hang`` (exit 3) naming the stuck ranks, their line, and the
  root's line; the twin, where the file appears, completes: ``ok``;
* Ctrl-C (SIGINT to dl2) on a healthy job: ``interrupted`` (exit 130); on a job where a
  rank sleeps in a helper while its peer waits: ``hang`` (exit 3);
* ``dl2 analyze`` of a run directory missing a rank's trace: ``incomplete`` (exit 5),
  never ``ok``; with a corrupt record in the middle of a file: the record is skipped with
  a warning naming the file and line, and the deadlock is still found.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from test_online import Run
from test_online import dl2_run

LAUNCHER = """
import os, socket, subprocess, sys, time

sock = socket.socket()
sock.bind(("127.0.0.1", 0))
port = sock.getsockname()[1]
sock.close()
worker, world, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
procs = []
for rank in range(world):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs.append(subprocess.Popen([sys.executable, worker], env=env))
# the launcher's own timeout: `limit` seconds once every rank is set up (a loaded
# machine may take long to start them), 120 s at most
started = time.monotonic()
while time.monotonic() - started < 120 and any(p.poll() is None for p in procs):
    if all(os.path.exists(f"{worker}.up{r}") for r in range(world)):
        break
    time.sleep(0.1)
deadline = time.monotonic() + limit
while time.monotonic() < deadline and any(p.poll() is None for p in procs):
    time.sleep(0.1)
for p in procs:  # the launcher's own timeout: terminate what still runs
    if p.poll() is None:
        p.terminate()
sys.exit(max(abs(p.wait()) for p in procs))
"""

ROOT_WAITS_ON_FILE = """
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
flag = sys.argv[0] + ".ready"
open(f"{sys.argv[0]}.up{rank}", "w").close()
weights = torch.zeros(8)
if rank == 2:
    while not os.path.exists(flag):  # the root waits for a checkpoint file
        time.sleep(0.05)
    weights += 1
elif rank == WRITER:
    open(flag, "w").close()
dist.broadcast(weights, src=2)  # ranks 0 and 1 wait here for the root
dist.destroy_process_group()
"""

LOOP = """
import sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
open(f"{sys.argv[0]}.up{dist.get_rank()}", "w").close()
t = torch.ones(4)
for step in range(2000):
    dist.all_reduce(t)
    time.sleep(0.02)
dist.destroy_process_group()
"""

SLEEPER = """
import sys, time
import torch
import torch.distributed as dist


def load_batch(rank):
    if rank == 1:
        time.sleep(3600)  # rank 1 never comes back


dist.init_process_group("gloo")
open(f"{sys.argv[0]}.up{dist.get_rank()}", "w").close()
t = torch.ones(4)
dist.all_reduce(t)
load_batch(dist.get_rank())
dist.all_gather_into_tensor(torch.empty(8), t)  # rank 0 waits here
dist.destroy_process_group()
"""

#: seconds a job gets, once every rank is set up, before it is ended from outside
LIMIT_S = 6


def _write(path: Path, text: str, **subst: str) -> Path:
    body = textwrap.dedent(text).lstrip()
    for key, value in subst.items():
        body = body.replace(key, value)
    path.write_text(body)
    return path


def _line(path: Path, marker: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if marker in line)


def _interrupted_run(
    dl2_bin: Path,
    run_dir: Path,
    script: Path,
    after: float,
    sig: signal.Signals = signal.SIGINT,
    times: int = 1,
) -> Run:
    """``dl2 run -n 2 SCRIPT`` sent ``sig`` (by its PID; ``times`` times, 0.2 s apart)
    ``after`` seconds after both ranks are set up (they touch ``SCRIPT.up<rank>``)."""
    log = run_dir.parent / f"{run_dir.name}.log"
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(dl2_bin), "run", "--run-dir", str(run_dir), "-n", "2", str(script)],
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            up = [Path(f"{script}.up{rank}") for rank in range(2)]
            while time.monotonic() - started < 120 and not all(p.exists() for p in up):
                time.sleep(0.1)
            time.sleep(after)
            for _ in range(times):
                proc.send_signal(sig)
                time.sleep(0.2)
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = -999
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    return Run(code, log.read_text(errors="replace"), run_dir, time.monotonic() - started)


@pytest.mark.timeout(300)
def test_a_job_its_launcher_kills_while_ranks_wait_on_a_busy_root_is_a_hang(dl2_bin, tmp_path):
    launcher = _write(tmp_path / "launch.py", LAUNCHER)
    bug = _write(tmp_path / "root_waits.py", ROOT_WAITS_ON_FILE, WRITER="-1")
    twin = _write(tmp_path / "root_waits_ok.py", ROOT_WAITS_ON_FILE, WRITER="0")
    python = str(Path(dl2_bin).parent / "python")
    run = dl2_run(
        dl2_bin, tmp_path / "bug", ["--", python, str(launcher), str(bug), "3", str(LIMIT_S)]
    )
    report = run.report
    assert run.returncode == 3 and report["verdict"] == "hang", run.output
    hang = report["findings"][0]
    assert hang["kind"] == "hang" and hang["ranks"] == [0, 1, 2], run.output
    stuck = {(o["rank"], o["op"], o["line"]) for o in hang["ops"]}
    line = _line(bug, "ranks 0 and 1 wait here")
    assert stuck == {(0, "broadcast", line), (1, "broadcast", line)}, run.output
    assert f"root_waits.py:{_line(bug, 'time.sleep(0.05)')}" in hang["message"], run.output
    assert "HANG: ranks 0 and 1 blocked in broadcast" in run.output, run.output
    # the twin: the file is written, the job completes
    ok = dl2_run(dl2_bin, tmp_path / "twin", ["--", python, str(launcher), str(twin), "3", "60"])
    assert ok.returncode == 0 and ok.report["verdict"] == "ok", ok.output


@pytest.mark.timeout(300)
def test_ctrl_c_on_a_healthy_job_is_interrupted_and_on_a_stuck_one_a_hang(dl2_bin, tmp_path):
    healthy = _write(tmp_path / "loop.py", LOOP)
    stuck = _write(tmp_path / "sleeper.py", SLEEPER)
    run = _interrupted_run(dl2_bin, tmp_path / "healthy", healthy, after=2)
    assert run.returncode == 130 and run.report["verdict"] == "interrupted", run.output
    assert run.report["findings"] == [] and run.meta["reason"] == "interrupted", run.output
    assert "INTERRUPTED:" in run.output, run.output
    run = _interrupted_run(dl2_bin, tmp_path / "stuck", stuck, after=LIMIT_S)
    assert run.returncode == 3 and run.report["verdict"] == "hang", run.output
    hang = run.report["findings"][0]
    assert [(o["rank"], o["line"]) for o in hang["ops"]] == [
        (0, _line(stuck, "rank 0 waits here"))
    ], run.output
    assert f"sleeper.py:{_line(stuck, 'never comes back')} in load_batch" in hang["message"]
    # dl2 analyze of the run directory gives the same verdict
    again = subprocess.run(
        [str(dl2_bin), "analyze", "-r", "json", str(run.run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 3 and json.loads(again.stdout)["verdict"] == "hang", again.stderr


@pytest.mark.timeout(300)
def test_a_closed_terminal_and_an_impatient_second_ctrl_c_still_stop_and_report(dl2_bin, tmp_path):
    # GIVEN SIGHUP (a closed terminal or ssh session) to dl2 on a healthy job
    healthy = _write(tmp_path / "loop.py", LOOP)
    run = _interrupted_run(dl2_bin, tmp_path / "hup", healthy, after=2, sig=signal.SIGHUP)
    # THEN it stops the job and reports, like Ctrl-C (it used to die and leak the ranks)
    assert run.returncode == 130 and run.report["verdict"] == "interrupted", run.output
    # GIVEN two Ctrl-C 0.2 s apart on a stuck job: the second lands while dl2 concludes
    stuck = _write(tmp_path / "sleeper.py", SLEEPER)
    run = _interrupted_run(dl2_bin, tmp_path / "twice", stuck, after=LIMIT_S, times=2)
    # THEN the exit status is the report's, and the page is written
    assert run.returncode == 3 and run.report["verdict"] == "hang", run.output
    assert (run.run_dir / "report.html").exists(), run.output  # the dev install has the html extra


@pytest.mark.timeout(300)
def test_missing_and_corrupt_traces_are_never_ok(dl2_bin, tmp_path):
    three = tmp_path / "three.py"
    three.write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(4)\n"
        "dist.all_reduce(t)\n"
        "dist.destroy_process_group()\n"
    )
    run = dl2_run(dl2_bin, tmp_path / "three", ["-n", "3", str(three)])
    assert run.returncode == 0, run.output

    def analyze(directory: Path) -> tuple[int, dict[str, object], str]:
        done = subprocess.run(
            [str(dl2_bin), "analyze", "--json", str(directory / "a.json"), str(directory)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return done.returncode, json.loads((directory / "a.json").read_text()), done.stdout

    # the twin: every trace there
    code, report, _ = analyze(run.run_dir)
    assert code == 0 and report["verdict"] == "ok"
    # one rank's trace gone: incomplete, naming the rank
    partial = tmp_path / "partial"
    shutil.copytree(run.run_dir, partial)
    next(partial.glob("rank00002.*.dl2.jsonl")).unlink()
    code, report, out = analyze(partial)
    assert code == 5 and report["verdict"] == "incomplete", out
    assert "INCOMPLETE" in out and "rank(s) 2" in out, out
    # a corrupt record in the middle of a deadlocked rank's trace: skipped, named
    sendsend = Path(__file__).resolve().parents[2] / "examples" / "sendsend.py"
    dead = dl2_run(dl2_bin, tmp_path / "dead", ["-n", "2", str(sendsend)])
    assert dead.returncode == 3, dead.output
    corrupt = tmp_path / "corrupt"
    shutil.copytree(dead.run_dir, corrupt)
    path = next(corrupt.glob("rank00000.*.dl2.jsonl"))
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(2, '{"k":"op","id":"not a number"}\n')
    path.write_text("".join(lines))
    code, report, out = analyze(corrupt)
    assert code == 3 and report["verdict"] == "deadlock", out
    warnings = report["warnings"]
    assert isinstance(warnings, list)
    assert any(f"{path}:3: corrupt record skipped" in w for w in warnings), warnings
