"""What an evaluation records: one result per case and per anchor run, and the run itself.

Each run appends one JSON line to ``benchmarks/results/results.jsonl`` (its options,
timings, summary, every case's :class:`Dl2Result`, the overhead rows and every
:class:`AnchorResult`); ``--render-last`` reads the last one back.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from dataclasses import dataclass
from dataclasses import field
from dataclasses import fields
from typing import Any

from benchmarks._harness import BENCH
from benchmarks._harness import REPO

RESULTS = BENCH / "results" / "results.jsonl"


@dataclass
class Dl2Result:
    """One `dl2 run` of a case, scored against its header."""

    case: str
    suite: str
    category: str
    label: str
    nondeterministic: bool
    verdict: str | None
    exit_code: int | None
    wall_s: float
    latency_s: float | None
    last_record_to_exit_s: float | None
    detected_after_s: float | None
    reason: str | None
    findings: list[dict[str, Any]]
    named_ranks: list[int]
    missing_lines: list[int]
    positive: bool
    verdict_ok: bool
    culprit_ok: bool | None
    note: str = ""
    job_exit_code: int | None = None  # the job's own exit status (run.json)


@dataclass
class AnchorResult:
    """One anchor run of a case (no dl2): what the user would have seen."""

    anchor: str
    case: str
    outcome: str
    time_s: float | None
    detected: bool
    culprit: bool | None
    named: list[int] = field(default_factory=list)
    evidence: str = ""
    #: the ranks of the wait cycle the tool named (dl2 on the FR dumps); None: none named
    cycle: list[int] | None = None


def append_record(record: dict[str, Any]) -> None:
    """Append one evaluation run to ``results.jsonl``."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


def last_record() -> tuple[dict[str, Any], list[Dl2Result], list[AnchorResult] | None] | None:
    """The last run of ``results.jsonl`` (record, case results, anchor results), or None."""
    if not RESULTS.exists():
        return None
    lines = [ln for ln in RESULTS.read_text().splitlines() if ln.strip()]
    record = json.loads(lines[-1])
    known = {f.name for f in fields(Dl2Result)}  # older records carry retired keys
    results = [Dl2Result(**{k: v for k, v in c.items() if k in known}) for c in record["cases"]]
    anchors = [AnchorResult(**a) for a in record["anchors"]] if record.get("anchors") else None
    return record, results, anchors


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def git_commit() -> str:
    """The repository's short commit, ``+dirty src`` when ``src`` has changes; ``?``."""
    with contextlib.suppress(Exception):
        return _git("rev-parse", "--short", "HEAD") + (
            "+dirty src" if _git("status", "--porcelain", "src") else ""
        )
    return "?"
