"""Scoring: a dl2 report against its case's header, and the totals over cases.

See ``benchmarks/evaluate.py`` for the definitions: positive, verdict match, exact
culprit, and what the anchors count.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from benchmarks._harness import Case
from benchmarks.evaluation.anchors import ANCHOR_COLUMNS
from benchmarks.evaluation.results import AnchorResult
from benchmarks.evaluation.results import Dl2Result


def _finding_ops(report: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for finding in report.get("findings", []):
        yield from finding.get("ops", [])


def score_report(case: Case, report: dict[str, Any]) -> dict[str, Any]:
    """The scored fields of a :class:`Dl2Result` for ``report`` (JSON; {} if none)."""
    verdict = report.get("verdict")
    findings = [
        {"kind": f.get("kind"), "ranks": f.get("ranks", [])} for f in report.get("findings", [])
    ]
    named = sorted({r for f in report.get("findings", []) for r in f.get("ranks", [])})
    located = {
        (os.path.basename(op["file"]), op.get("line"))
        for op in _finding_ops(report)
        if op.get("file")
    }
    missing = [n for n in case.culprits if (case.path.name, n) not in located]
    positive = verdict in ("deadlock", "hang", "defect")
    accepted = {case.label} | ({"defect"} if case.nondeterministic else set())
    if case.label == "deadlock":
        accepted.add("hang")  # the job hangs; dl2 names who waits on whom, and where
    culprit_ok = None
    if case.positive:
        culprit_ok = positive and set(named) >= case.ranks and not missing
    return {
        "verdict": verdict,
        "findings": findings,
        "named_ranks": named,
        "missing_lines": missing,
        "positive": positive,
        "verdict_ok": verdict in accepted,
        "culprit_ok": culprit_ok,
    }


def group_stats(
    results: list[Dl2Result], anchors: dict[tuple[str, str], AnchorResult] | None
) -> dict[str, Any]:
    """Counts over ``results`` (precision, recall, latencies) and each anchor's."""
    pos = [r for r in results if r.label != "ok"]
    neg = [r for r in results if r.label == "ok"]
    tp = sum(r.positive for r in pos)
    fp = sum(r.positive for r in neg)
    stats: dict[str, Any] = {
        "n": len(results),
        "deadlock": sum(r.label == "deadlock" for r in results),
        "defect": sum(r.label == "defect" for r in results),
        "ok": len(neg),
        "tp": tp,
        "fp": fp,
        "fn": len(pos) - tp,
        "precision": None if tp + fp == 0 else tp / (tp + fp),
        "recall": None if not pos else tp / len(pos),
        "verdict_ok": sum(r.verdict_ok for r in results),
        "culprit_ok": sum(bool(r.culprit_ok) for r in pos),
        "positives": len(pos),
        "latency": [r.latency_s for r in results if r.positive and r.latency_s is not None],
        "latency_deadlock": [
            r.latency_s
            for r in results
            if r.verdict == "deadlock" and r.label == "deadlock" and r.latency_s is not None
        ],
    }
    if anchors:
        for name in ANCHOR_COLUMNS:
            got = [anchors.get((name, r.case)) for r in results]
            det_pos = sum(
                bool(a and a.detected) for a, r in zip(got, results, strict=True) if r.label != "ok"
            )
            fa = sum(
                bool(a and a.detected) for a, r in zip(got, results, strict=True) if r.label == "ok"
            )
            cul = sum(
                bool(a and a.culprit) for a, r in zip(got, results, strict=True) if r.label != "ok"
            )
            times = [
                a.time_s
                for a, r in zip(got, results, strict=True)
                if a and a.detected and r.label != "ok" and a.time_s is not None
            ]
            broken = [
                r.case
                for a, r in zip(got, results, strict=True)
                if r.label == "ok" and a is not None and a.outcome != "exit 0"
            ]
            cycles = sum(
                bool(a and a.cycle) for a, r in zip(got, results, strict=True) if r.label != "ok"
            )
            stats[name] = {
                "cycle": cycles,
                "detected": det_pos,
                "false_alarms": fa,
                "culprit": cul,
                "times": times,
                "ok_runs_failed": broken,
            }
    return stats


def summary_all(results: list[Dl2Result], anchors: list[AnchorResult]) -> dict[str, Any]:
    """:func:`group_stats` over every case, with the anchors' results."""
    return group_stats(results, {(a.anchor, a.case): a for a in anchors})


def _miss_reason(r: Dl2Result) -> str:
    if r.note:
        return r.note
    if r.label == "ok":
        kinds = ", ".join(f"{f['kind']} {f['ranks']}" for f in r.findings)
        return f"false alarm: verdict {r.verdict} ({kinds})"
    if not r.positive:
        extra = ""
        if r.nondeterministic and r.verdict == "ok":
            extra = " (this run's interleaving completed, no potential-deadlock finding)"
        return f"missed: verdict {r.verdict} (reason {r.reason}){extra}"
    parts = []
    if not r.verdict_ok:
        parts.append(f"verdict {r.verdict}, label {r.label}")
    if r.culprit_ok is False:
        parts.append(
            f"findings {[(f['kind'], f['ranks']) for f in r.findings]}"
            + (f", culprit lines not located {r.missing_lines}" if r.missing_lines else "")
        )
    return "; ".join(parts)


def nondeterministic_summary(results: list[Dl2Result]) -> str:
    """How the nondeterministic positive cases went in this run: shown, flagged, missed."""
    cases = [r for r in results if r.nondeterministic and r.label != "ok"]
    if not cases:
        return ""

    def clean_finish(r: Dl2Result) -> bool:  # older records lack the job's own status
        job = r.exit_code if r.job_exit_code is None else r.job_exit_code
        return r.reason == "finished" and job == 0

    shown = [r for r in cases if not clean_finish(r)]
    clean = [r for r in cases if clean_finish(r)]
    predicted = [r for r in clean if r.positive]
    missed = [r.case for r in clean if not r.positive]
    text = (
        f"Nondeterministic cases: {len(cases)} labelled deadlock/defect; in this run the bug "
        f"showed (the job did not finish cleanly) in {len(shown)}, dl2 flagged "
        f"{sum(r.positive for r in shown)} of them; {len(clean)} finished cleanly, of which "
        f"dl2 still flagged {len(predicted)} from the trace"
    )
    if missed:
        text += (
            f" and missed {len(missed)} ({', '.join(f'`{c}`' for c in missed)}: what makes "
            "them break (which op completed first, a random draw) feeds a later call's "
            "arguments in the user's code and leaves no mark in a clean run's trace)"
        )
    return text + "."


def misses(results: list[Dl2Result]) -> list[str]:
    """One line per case dl2 got wrong (or that left a note), with why."""
    out = []
    for r in results:
        bad = (r.label == "ok" and (r.positive or not r.verdict_ok)) or (
            r.label != "ok" and (not r.positive or not r.verdict_ok or not r.culprit_ok)
        )
        if bad or r.note:
            out.append(f"`{r.case}` ({r.label}): {_miss_reason(r)}")
    return out
