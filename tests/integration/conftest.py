"""Fixtures of the integration tests: the ``dl2`` executable under test."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def dl2_bin() -> Path:
    """The ``dl2`` console script of the repository's virtual environment.

    ``DL2_BIN`` overrides the path. Every test that uses it *fails* when the script is
    missing or ``dl2 run --help`` does not exit 0: a broken install must not pass as a
    run of skipped tests.
    """
    path = Path(os.environ.get("DL2_BIN", REPO / ".venv" / "bin" / "dl2"))
    if not path.exists():
        pytest.fail(f"dl2 CLI not found at {path}; run `make install` first")
    try:
        probe = subprocess.run(
            [str(path), "run", "--help"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"`{path} run --help` failed: {exc}")
    if probe.returncode != 0:
        pytest.fail(f"`{path} run --help` exited {probe.returncode}: dl2 run is not available")
    return path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration starts real processes: mark it so.  A test
    marked ``cuda`` is skipped where no CUDA device exists."""
    here = Path(__file__).resolve().parent
    cuda: bool | None = None
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("cuda") is not None:
            if cuda is None:
                cuda = _cuda_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False
