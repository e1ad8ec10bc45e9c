"""The evaluation's tables: on stdout, and as the ``eval`` section of docs/benchmarks.md."""

from __future__ import annotations

import os
import re
import statistics
from typing import Any

from benchmarks._harness import REPO
from benchmarks._harness import markdown_table
from benchmarks.evaluation.anchors import ANCHOR_CAP_S
from benchmarks.evaluation.anchors import ANCHOR_COLUMNS
from benchmarks.evaluation.anchors import WORKLOAD_CAP_S
from benchmarks.evaluation.dl2_runs import HANG_TIMEOUT_S
from benchmarks.evaluation.overhead import WARMUP_STEPS
from benchmarks.evaluation.results import AnchorResult
from benchmarks.evaluation.results import Dl2Result
from benchmarks.evaluation.scoring import group_stats
from benchmarks.evaluation.scoring import misses
from benchmarks.evaluation.scoring import nondeterministic_summary
from benchmarks.evaluation.scoring import summary_all

DOCS = REPO / "docs" / "benchmarks.md"
START, END = "<!-- eval:start -->", "<!-- eval:end -->"


def _frac(num: int, den: int) -> str:
    return "–" if den == 0 else f"{num}/{den}"


def _lat(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{statistics.median(values):.1f}/{max(values):.1f}"


def build_table(
    results: list[Dl2Result], anchors: dict[tuple[str, str], AnchorResult] | None
) -> tuple[str, dict[str, Any]]:
    """The markdown table: one row per category, then the totals."""
    header = [
        "category",
        "cases (dl/df/ok)",
        "dl2 precision",
        "dl2 recall",
        "verdict = label",
        "exact culprit",
        "dl2 latency med/max s",
    ]
    if anchors:
        header += [
            "plain: fails (FA)",
            "DETAIL: det/culprit (FA)",
            "FR torchfrtrace: det/culprit (FA)",
            "FR dl2: det/culprit/cycle (FA)",
        ]
    rows = []
    groups: dict[str, list[Dl2Result]] = {}
    for r in results:
        key = f"{r.category}" + (" (workloads)" if r.suite == "workloads" else "")
        groups.setdefault(key, []).append(r)
    summary: dict[str, Any] = {}

    def row(name: str, members: list[Dl2Result], bold: bool = False) -> list[str]:
        s = group_stats(members, anchors)
        summary[name] = {k: v for k, v in s.items() if k not in ("latency", "latency_deadlock")}
        summary[name]["latency_median"] = statistics.median(s["latency"]) if s["latency"] else None
        summary[name]["latency_max"] = max(s["latency"]) if s["latency"] else None
        cells = [
            f"**{name}**" if bold else name,
            f"{s['n']} ({s['deadlock']}/{s['defect']}/{s['ok']})",
            "–" if s["precision"] is None else f"{100 * s['precision']:.0f}%",
            "–" if s["recall"] is None else f"{100 * s['recall']:.0f}%",
            _frac(s["verdict_ok"], s["n"]),
            _frac(s["culprit_ok"], s["positives"]),
            _lat(s["latency"]),
        ]
        if anchors:
            p, d, f, g = s["plain"], s["detail"], s["fr"], s["fr-dl2"]
            cells += [
                f"{_frac(p['detected'], s['positives'])} ({p['false_alarms']})",
                f"{_frac(d['detected'], s['positives'])} / {d['culprit']} ({d['false_alarms']})",
                f"{_frac(f['detected'], s['positives'])} / {f['culprit']} ({f['false_alarms']})",
                f"{_frac(g['detected'], s['positives'])} / {g['culprit']} / {g['cycle']} "
                f"({g['false_alarms']})",
            ]
        return cells

    for name in sorted(groups):
        rows.append(row(name, groups[name]))
    synthetic = [r for r in results if r.suite == "cases"]
    workloads = [r for r in results if r.suite == "workloads"]
    if synthetic and workloads:
        rows.append(row("all synthetic cases", synthetic, bold=True))
        rows.append(row("all workloads", workloads, bold=True))
    rows.append(row("all", results, bold=True))
    return markdown_table(header, rows), summary


def overhead_table(rows: list[dict[str, Any]]) -> str:
    """The overhead rows of :func:`~benchmarks.evaluation.overhead.measure_overhead`."""
    header = [
        "workload",
        "steps × pairs",
        "plain step ms",
        "dl2 step ms",
        "step-time ratio (range)",
        "peak RSS plain MiB",
        "peak RSS dl2 MiB",
        "RSS ratio",
    ]
    cells = []
    for o in rows:
        spread = f" ({o['ratio_min']}–{o['ratio_max']})" if "ratio_min" in o else ""
        cells.append(
            [
                f"`{o['case']}`",
                f"{o['steps_per_run']} × {o['pairs']}",
                f"{o.get('plain_step_ms', '–')}",
                f"{o.get('dl2_step_ms', '–')}",
                f"{o.get('ratio', '–')}{spread}",
                f"{o.get('plain_rss_mib', '–')}",
                f"{o.get('dl2_rss_mib', '–')}",
                f"{o.get('rss_ratio', '–')}",
            ]
        )
    return markdown_table(header, cells)


def update_docs(section: str) -> None:
    """Replace the ``eval`` section of docs/benchmarks.md (or add it)."""
    block = f"{START}\n{section.rstrip()}\n{END}"
    if DOCS.exists():
        text = DOCS.read_text()
        if START in text and END in text:
            before, rest = text.split(START, 1)
            after = rest.split(END, 1)[1]
            text = before + block + after
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
    else:
        DOCS.parent.mkdir(parents=True, exist_ok=True)
        text = "# Benchmarks\n\n" + block + "\n"
    DOCS.write_text(text)


def docs_section(
    command: str,
    table: str,
    results: list[Dl2Result],
    overhead: list[dict[str, Any]],
    anchors: list[AnchorResult] | None,
    elapsed: float,
    stamp: str,
    commit: str,
) -> str:
    """The ``eval`` section of docs/benchmarks.md for one run."""
    miss = misses(results)
    parts = [
        "## Evaluation: dl2 on ground-truthed cases and real workloads",
        "",
        f"Command: `{command}` (took {elapsed / 60:.1f} min on this machine, "
        f"{os.cpu_count()} cores; {stamp}, commit {commit}).",
        "",
        "What the columns mean (full definitions in `benchmarks/evaluate.py` and "
        "`benchmarks/cases/README.md`): *cases* counts labels deadlock/defect/ok; a positive "
        "is a `deadlock`, `hang` or `defect` verdict of `dl2 run --hang-timeout "
        f"{HANG_TIMEOUT_S}` (a case with `interrupt=S` gets SIGINT S seconds in, as from a "
        "user); *verdict = label* also accepts `defect` for nondeterministic cases and "
        "`hang` for deadlock cases; *exact culprit* = findings name ⊇ the expected ranks and every "
        "`# dl2: culprit` line; *latency* = seconds from the last trace record of any rank "
        "(the job stopped progressing or ended) to dl2's exit, or dl2's own `detected_after` "
        "(run.json) for deadlocks proven live, over positive verdicts.",
    ]
    if anchors:
        parts += [
            "",
            f"Anchors (same cases, no dl2, {ANCHOR_CAP_S:.0f} s cap per run, "
            f"{WORKLOAD_CAP_S:.0f} s for the workloads): *plain* = gloo "
            "defaults, counted when within the cap some rank exits with an error or prints a "
            "traceback (gloo never names a culprit); *DETAIL* = "
            "`TORCH_DISTRIBUTED_DEBUG=DETAIL`, counted when a rank prints "
            "`Detected mismatch between collectives` or `failed to pass "
            "monitoredBarrier`, culprit when those lines name ⊇ the expected ranks; *FR* = "
            "Flight Recorder dump (taken by a hook at the cap, at an exception or at "
            "`destroy_process_group`: torch never dumps gloo by itself) analysed by "
            "`torchfrtrace` after repairing the gloo dump's empty `pg_config` (unrepaired, "
            "the analyser fails on every gloo dump that holds a collective), counted when it "
            "reports `has errors` "
            "or `Not all ranks joining`, culprit when its `Culprit rank`/`missing ranks` "
            "⊇ the expected ranks. (FA) = false alarms on the ok cases.",
        ]
    parts += ["", table, ""]
    if overhead:
        parts += [
            "Recording overhead on the clean workloads (fresh runs in back-to-back dl2 / plain "
            "pairs, the order alternating from pair to pair; a pair's ratio = median step "
            "time of rank 0 under dl2 / plain, first "
            f"{WARMUP_STEPS} steps of each run dropped; the table gives the median ratio and "
            "the range over pairs; peak RSS = largest `ru_maxrss` of any rank):",
            "",
            overhead_table(overhead),
            "",
        ]
    if anchors:
        total = summary_all(results, anchors)
        for name in ANCHOR_COLUMNS:
            broken = total[name]["ok_runs_failed"]
            if broken:
                parts.append(
                    f"Under the {name} anchor, {len(broken)} correct case(s) did not exit 0: "
                    + ", ".join(f"`{c}`" for c in broken)
                    + "."
                )
        parts.append("")
    parts += ["dl2 misses in this run:", ""]
    parts += [f"* {m}" for m in miss] or ["* none"]
    if nd := nondeterministic_summary(results):
        parts += ["", nd]
    if anchors:
        times: dict[str, list[float]] = {}
        for a in anchors:
            if a.detected and a.time_s is not None:
                times.setdefault(a.anchor, []).append(a.time_s)
        dl2_lat = [r.latency_s for r in results if r.positive and r.latency_s is not None]
        dl2_wall = [r.wall_s for r in results if r.positive]
        parts += [
            "",
            "Time to a signal, positives only (median / max seconds): dl2 latency "
            f"{_lat(dl2_lat)}, dl2 wall {_lat(dl2_wall)}; "
            + "; ".join(f"{name} {_lat(times.get(name, []))}" for name in ANCHOR_COLUMNS)
            + " (anchors: launch to the first failing rank, or to the FR dump).",
        ]
    if anchors:
        parts += ["", anchor_notes(anchors)]
    parts += ["", per_case_table(results, anchors), ""]
    parts += ["Per-case results of every run: `benchmarks/results/results.jsonl`."]
    return "\n".join(parts)


def anchor_notes(anchors: list[AnchorResult]) -> str:
    """What the anchors' runs showed about the tools themselves (from their evidence)."""
    fr = [a for a in anchors if a.anchor == "fr" and a.evidence.startswith("dumps {")]
    raw_failed = [a for a in fr if "raw: ok" not in a.evidence]
    kinds = sorted({m.group(1) for a in raw_failed if (m := re.search(r"raw: (\w+)", a.evidence))})
    segv = sorted(
        {a.case for a in anchors if a.anchor == "detail" and "SIGSEGV" in a.evidence}
        - {a.case for a in anchors if a.anchor == "plain" and "SIGSEGV" in a.evidence}
    )
    lines = [
        "Anchor notes (torch 2.13.0, gloo): the Flight Recorder records gloo collectives "
        "but no send/recv, so P2P bugs are invisible to it; torch writes no FR dump for "
        "gloo by itself (the hook takes torch's on-demand dump); the first dump of a process "
        "symbolises stacks and costs about 3 s of CPU (and imports about 800 modules). "
        f"`torchfrtrace` as shipped failed on {len(raw_failed)} of {len(fr)} runs with dumps "
        f"({', '.join(kinds) or '–'}: gloo's empty `pg_config`); the FR column is the "
        "analysis of the repaired dumps."
    ]
    if segv:
        lines.append(
            f"With `TORCH_DISTRIBUTED_DEBUG=DETAIL`, {len(segv)} job(s) crashed with SIGSEGV "
            "(not under plain gloo): " + ", ".join(f"`{c}`" for c in segv) + "."
        )
    return " ".join(lines)


def per_case_table(results: list[Dl2Result], anchors: list[AnchorResult] | None) -> str:
    """Every case on one line, inside a collapsed block."""
    amap = {(a.anchor, a.case): a for a in anchors or []}
    header = ["case", "label", "dl2 verdict", "culprit", "latency s"]
    if anchors:
        header += ["plain", "DETAIL", "FR", "FR dl2"]
    rows = []
    for r in results:
        culprit = "–" if r.culprit_ok is None else ("yes" if r.culprit_ok else "no")
        lat = "–" if r.latency_s is None else f"{r.latency_s:.1f}"
        nd = " (nd)" if r.nondeterministic else ""
        row = [f"`{r.case}`", f"{r.label}{nd}", r.verdict or "none", culprit, lat]
        if anchors:
            for name in ANCHOR_COLUMNS:
                a = amap.get((name, r.case))
                if a is None:
                    row.append("–")
                    continue
                mark = " **det**" if a.detected else ""
                mark += f" {a.named}" if a.named and a.anchor != "plain" else ""
                mark += f" cycle {a.cycle}" if a.cycle else ""
                row.append(f"{a.outcome}{mark}")
        rows.append(row)
    table = markdown_table(header, rows)
    return "\n".join(["<details><summary>Per-case results</summary>", "", table, "", "</details>"])
