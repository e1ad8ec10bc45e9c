"""Golden files: compare renderer output with ``tests/gold/`` (see tests/gold/README.md).

On a mismatch the actual output is written to ``tests/actual/`` (git-ignored) so it can
be diffed or copied over; with ``DL2_UPDATE_GOLD=1`` the gold files are rewritten instead.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

GOLD_DIR = Path(__file__).parent / "gold"
ACTUAL_DIR = Path(__file__).parent / "actual"
UPDATE_ENV = "DL2_UPDATE_GOLD"


def check_gold(name: str, actual: str) -> None:
    """Fail unless ``actual`` equals the gold file ``tests/gold/<name>``.

    Args:
        name: the file name under tests/gold/, e.g. ``sendsend_deadlock.txt``.
        actual: what the code under test produced.
    """
    gold = GOLD_DIR / name
    if os.environ.get(UPDATE_ENV) == "1":
        gold.parent.mkdir(parents=True, exist_ok=True)
        gold.write_text(actual, encoding="utf-8", newline="\n")
        return
    expected = gold.read_text(encoding="utf-8") if gold.exists() else None
    if actual == expected:
        return
    saved = ACTUAL_DIR / name
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(actual, encoding="utf-8", newline="\n")
    if expected is None:
        pytest.fail(f"no gold file {gold}; output saved to {saved}; {UPDATE_ENV}=1 creates it")
    diff = "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=str(gold),
            tofile=str(saved),
        )
    )
    pytest.fail(f"output differs from {gold} (rerun with {UPDATE_ENV}=1 to accept):\n{diff}")
