"""``dl2 run``: how it starts a job (like ``torchrun --standalone``) and when it ends one."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_online import dl2_run

CASES = Path(__file__).resolve().parent / "record_cases"


@pytest.mark.timeout(150)
def test_the_job_store_outlives_rank_0_as_under_torchrun(dl2_bin: Path, tmp_path: Path) -> None:
    case = CASES / "case_store_outlives_rank0.py"
    run = dl2_run(dl2_bin, tmp_path / "run", ["--hang-timeout", "30", "-n", "2", str(case)])
    assert "STORE_OUTLIVED_RANK0" in run.output, run.output
    assert "Connection reset" not in run.output, run.output
    assert run.returncode == 0, run.output
    assert run.report["verdict"] == "ok", run.output


@pytest.mark.timeout(150)
def test_a_cycle_hidden_by_a_heartbeat_thread_ends_at_the_hang_timeout(
    dl2_bin: Path, tmp_path: Path
) -> None:
    case = CASES / "case_heartbeat_cycle.py"
    line = next(
        i for i, s in enumerate(case.read_text().splitlines(), 1) if s.startswith("dist.recv")
    )
    run = dl2_run(dl2_bin, tmp_path / "run", ["--hang-timeout", "5", "-n", "2", str(case)], 100)
    assert run.returncode == 3, run.output
    report = run.report
    assert report["verdict"] == "hang", run.output
    (finding,) = report["findings"]
    assert finding["kind"] == "hang", run.output
    assert {(o["rank"], o["line"]) for o in finding["ops"]} == {(0, line), (1, line)}
    assert any("sat blocked on each other for 5 s" in w for w in report["warnings"]), run.output


@pytest.mark.timeout(150)
def test_a_json_path_that_cannot_be_written_costs_neither_verdict_nor_report(
    dl2_bin: Path, tmp_path: Path
) -> None:
    sendsend = Path(__file__).resolve().parents[2] / "examples" / "sendsend.py"
    (tmp_path / "afile").write_text("")
    json_path = tmp_path / "afile" / "report.json"  # its parent is a file
    run = dl2_run(dl2_bin, tmp_path / "run", ["--json", str(json_path), "-n", "2", str(sendsend)])
    assert run.returncode == 3, run.output
    assert run.report["verdict"] == "deadlock", run.output  # run_dir/report.json
    assert (tmp_path / "run" / "report.html").exists()
    assert "cannot write the report to" in run.output, run.output


@pytest.mark.timeout(150)
def test_dl2_analyze_of_a_deadlocked_run_reads_what_the_live_verdict_read(
    dl2_bin: Path, tmp_path: Path
) -> None:
    import json
    import subprocess

    sendsend = Path(__file__).resolve().parents[2] / "examples" / "sendsend.py"
    run = dl2_run(dl2_bin, tmp_path / "run", ["-n", "2", str(sendsend)])
    assert run.returncode == 3, run.output
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert set(meta["read_upto"]) == {p.name for p in (tmp_path / "run").glob("*.dl2.jsonl")}
    offline = subprocess.run(
        [str(dl2_bin), "analyze", str(tmp_path / "run"), "-r", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert offline.returncode == 3, offline.stderr
    live = run.report
    again = json.loads(offline.stdout)
    assert again["verdict"] == live["verdict"]
    assert again["findings"] == live["findings"]


@pytest.mark.timeout(150)
def test_torchs_detail_checks_still_run_under_dl2(dl2_bin: Path, tmp_path: Path) -> None:
    case = CASES / "case_debug_detail.py"
    run = dl2_run(dl2_bin, tmp_path / "run", ["--hang-timeout", "60", "-n", "2", str(case)])
    assert "Detected mismatch between collectives" in run.output, run.output
    assert run.returncode == 4, run.output  # the mismatch, from the trace
    assert run.wall < 50, run.output  # failed fast, as without dl2; not a hang timeout
