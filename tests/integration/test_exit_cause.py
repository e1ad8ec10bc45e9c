"""End-to-end: a rank whose program ends with an uncaught exception is named with it.

The recorder's exit hook writes the exception and the user's stack where it was raised
into the ``end`` record; the findings about the collective it never issued, and the
orphaned wait of its peer, quote both.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_online import dl2_run

from ports import free_port

CASES = Path(__file__).resolve().parents[2] / "benchmarks" / "cases"
CASE = CASES / "rank_exit__uncaught_exception.py"


def _line(text: str) -> int:
    lines = CASE.read_text().splitlines()
    return next(i for i, s in enumerate(lines, 1) if s.strip().startswith(text))


@pytest.mark.timeout(150)
def test_the_exception_that_ended_a_rank_is_named_with_its_line(
    dl2_bin: Path, tmp_path: Path
) -> None:
    run = dl2_run(dl2_bin, tmp_path / "run", ["--hang-timeout", "30", "-n", "2", str(CASE)])
    assert run.returncode == 4, run.output
    report = run.report
    assert report["verdict"] == "defect", run.output
    cause = f"ValueError: shard 1 is corrupt, raised at {CASE.name}:{_line('raise ValueError')}"
    kinds = {f["kind"]: f for f in report["findings"]}
    assert cause in kinds["collective-missing"]["message"], run.output
    assert cause in kinds["orphaned-wait"]["message"], run.output
    culprit = _line("dist.all_reduce(batch)")
    assert {(o["rank"], o["line"]) for o in kinds["orphaned-wait"]["ops"]} == {(0, culprit)}
    assert any(
        re.match(r"rank 1's program ended with an uncaught ValueError", w)
        for w in report["warnings"]
    ), run.output


SPAWN_CASE = Path(__file__).resolve().parent / "record_cases" / "case_spawn_raises.py"


@pytest.mark.timeout(150)
def test_the_exception_of_a_spawn_worker_is_named_with_its_line(
    dl2_bin: Path, tmp_path: Path
) -> None:
    # GIVEN mp.spawn workers, one of which raises: torch catches the exception in the
    # worker and exits with status 1, so Python never sees it uncaught
    port = str(free_port())
    python = str(dl2_bin.parent / "python")
    run = dl2_run(
        dl2_bin, tmp_path / "run", ["--hang-timeout", "30", "--", python, str(SPAWN_CASE), port]
    )
    # THEN the findings still quote the exception and the line that raised it
    raised = next(
        i for i, s in enumerate(SPAWN_CASE.read_text().splitlines(), 1) if "mark: raise" in s
    )
    cause = f"ValueError: shard 1 is corrupt, raised at {SPAWN_CASE.name}:{raised}"
    messages = [f["message"] for f in run.report["findings"]]
    assert any(cause in m for m in messages), run.output


KILLED_CASE = Path(__file__).resolve().parent / "record_cases" / "case_spawn_killed.py"


KILLED_TORCHRUN_CASE = Path(__file__).resolve().parent / "record_cases" / "case_killed_rank.py"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher", ["spawn", "torchrun"])
def test_a_rank_killed_by_a_signal_is_named_killed(
    dl2_bin: Path, tmp_path: Path, launcher: str
) -> None:
    # GIVEN ranks of mp.spawn or torchrun, one of which is killed by SIGKILL (the OOM
    # killer): dl2 run sees only the launcher's exit status, the launcher the rank's
    python = str(dl2_bin.parent / "python")
    command = (
        [python, str(KILLED_CASE), str(free_port())]
        if launcher == "spawn"
        else [
            str(dl2_bin.parent / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "2",
            str(KILLED_TORCHRUN_CASE),
        ]
    )
    run = dl2_run(dl2_bin, tmp_path / "run", ["--hang-timeout", "30", "--", *command])
    # THEN the job failed, the worker is named as killed from outside, the other as
    # failed because of it
    assert run.returncode == 1, run.output
    assert run.meta["ranks"]["1"]["state"] == "killed", run.output
    assert "rank 1 was killed by a signal (the OOM killer" in run.output, run.output


FORK_CASE = Path(__file__).resolve().parent / "record_cases" / "case_fork_procs.py"


@pytest.mark.timeout(200)
def test_forked_workers_that_exit_without_destroy_end_cleanly_or_with_their_exception(
    dl2_bin: Path, tmp_path: Path
) -> None:
    # GIVEN multiprocessing.Process workers (fork): a forked child ends with os._exit,
    # which runs no exit hook, and they never call destroy_process_group
    python = str(dl2_bin.parent / "python")
    ok = dl2_run(dl2_bin, tmp_path / "ok", ["--", python, str(FORK_CASE), str(free_port()), "ok"])
    # THEN a correct job is ok, not a job "stopped from outside"
    assert ok.returncode == 0 and ok.report["verdict"] == "ok", ok.output
    # AND a worker that raises is named with its exception and line
    failed = dl2_run(
        dl2_bin, tmp_path / "raise", ["--", python, str(FORK_CASE), str(free_port()), "raise"]
    )
    raised = next(
        i for i, s in enumerate(FORK_CASE.read_text().splitlines(), 1) if "mark: raise" in s
    )
    cause = f"ValueError: shard 1 is corrupt, raised at {FORK_CASE.name}:{raised}"
    assert failed.report["verdict"] == "defect", failed.output
    assert any(cause in f["message"] for f in failed.report["findings"]), failed.output
