"""``dl2 run -n``: ranks started like ``torchrun --standalone``."""

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
