"""``make gpu-check`` (benchmarks/gpu_check.py): it skips cleanly without CUDA, its gloo
steps pass on CPU tensors (a dry run of the script itself), and on a CUDA machine the
whole check passes (marked ``cuda``: skipped here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def _check(out: Path, timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, OUT=str(out), PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    full.update(env)
    return subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=full,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.timeout(120)
def test_skips_with_a_message_and_exit_0_without_cuda(tmp_path: Path) -> None:
    if _cuda():
        pytest.skip("a CUDA device is present")
    done = _check(tmp_path, 100)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIP: no CUDA device here" in done.stdout
    assert (tmp_path / "gpu_check.log").read_text().count("SKIP") == 1


@pytest.mark.timeout(300)
def test_dry_run_of_the_gloo_steps_on_cpu(tmp_path: Path) -> None:
    if _cuda():
        pytest.skip("a CUDA device is present: the real check runs instead")
    done = _check(tmp_path, 280, DL2_GPU_CHECK_DRY="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gloo-cuda-order  ok" in done.stdout and "gloo-cuda-ok     ok" in done.stdout
    assert "deadlock proven" in done.stdout
    assert (tmp_path / "runs" / "gloo-cuda-order" / "run.json").exists()


@pytest.mark.cuda
@pytest.mark.timeout(420)
def test_gpu_check_passes(tmp_path: Path) -> None:
    done = _check(tmp_path, 400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all steps passed" in done.stdout
    assert (tmp_path / "fr-pickle" / "nccl_trace_rank_0").stat().st_size > 0
