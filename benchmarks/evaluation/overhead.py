"""Recording overhead on the clean workloads: fresh runs in dl2/plain pairs.

Each workload logs its per-step wall times and peak RSS (``_common.StepLog``); the
pairs run back to back, their order alternating, so slow drift of the machine hits
both sides.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from benchmarks._harness import Case
from benchmarks._harness import launch
from benchmarks.evaluation.dl2_runs import RUN_TIMEOUT_S
from benchmarks.evaluation.dl2_runs import run_dl2

#: steps the clean workloads run when their step time is measured
OVERHEAD_STEPS = 60
WARMUP_STEPS = 3


def _read_step_logs(log_dir: Path) -> tuple[list[float], int]:
    """(rank 0's step times without warm-up, largest ru_maxrss in KiB over ranks)."""
    steps: list[float] = []
    rss = 0
    for path in sorted(log_dir.glob("rank*.json")):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            rss = max(rss, int(data.get("maxrss_kb", 0)))
            if path.name == "rank0.json":
                steps = list(data.get("steps", []))[WARMUP_STEPS:]
    return steps, rss


def measure_overhead(case: Case, workdir: Path, pairs: int, steps: int) -> dict[str, Any]:
    """Fresh runs of ``case`` in back-to-back dl2/plain pairs, the order alternating.

    Pair i runs dl2 first when i is even and plain first when it is odd; its ratio is
    the median step time of the dl2 run over that of the plain run.  The overhead is
    the median of the pair ratios (their range shows the machine's noise).
    """
    dl2_logs, plain_logs = [], []

    def dl2_run(i: int) -> None:
        sub = workdir / f"ovh{i}"
        sub.mkdir(exist_ok=True)
        log = workdir / f"ovh-{case.name}-dl2_{i}"
        run_dl2(case, sub, log, steps)
        dl2_logs.append(log)

    def plain_run(i: int) -> None:
        log = workdir / f"ovh-{case.name}-plain{i}"
        run = launch(
            case.path,
            case.world,
            RUN_TIMEOUT_S,
            {"DL2_BENCH_LOG": str(log), "DL2_BENCH_STEPS": str(steps)},
        )
        shutil.rmtree(run.outdir, ignore_errors=True)
        plain_logs.append(log)

    for i in range(pairs):
        for run in (dl2_run, plain_run) if i % 2 == 0 else (plain_run, dl2_run):
            run(i)
    ratios = []
    dl2_medians, plain_medians = [], []
    dl2_rss = plain_rss = 0
    for dl2_log, plain_log in zip(dl2_logs, plain_logs, strict=True):
        d_steps, d_rss = _read_step_logs(dl2_log)
        p_steps, p_rss = _read_step_logs(plain_log)
        dl2_rss, plain_rss = max(dl2_rss, d_rss), max(plain_rss, p_rss)
        if d_steps and p_steps:
            d, p = statistics.median(d_steps), statistics.median(p_steps)
            dl2_medians.append(d)
            plain_medians.append(p)
            ratios.append(d / p)
    result: dict[str, Any] = {"case": case.name, "pairs": len(ratios), "steps_per_run": steps}
    if ratios:
        result.update(
            dl2_step_ms=round(statistics.median(dl2_medians) * 1e3, 2),
            plain_step_ms=round(statistics.median(plain_medians) * 1e3, 2),
            ratio=round(statistics.median(ratios), 3),
            ratio_min=round(min(ratios), 3),
            ratio_max=round(max(ratios), 3),
        )
    if dl2_rss and plain_rss:
        result.update(
            dl2_rss_mib=round(dl2_rss / 1024, 1),
            plain_rss_mib=round(plain_rss / 1024, 1),
            rss_ratio=round(dl2_rss / plain_rss, 3),
        )
    return result


def run_overhead(cases: list[Case], workdir: Path, pairs: int, steps: int) -> list[dict[str, Any]]:
    """:func:`measure_overhead` on every clean workload of ``cases``, printing the figures."""
    overhead = []
    for case in cases:
        if case.suite == "workloads" and case.label == "ok" and pairs > 0:
            print(f"  overhead: {case.name} ({pairs} dl2/plain pair(s))", flush=True)
            overhead.append(measure_overhead(case, workdir, pairs, steps))
            o = overhead[-1]
            print(
                f"    step ms plain {o.get('plain_step_ms')} dl2 {o.get('dl2_step_ms')} "
                f"ratio {o.get('ratio')}; RSS MiB plain {o.get('plain_rss_mib')} "
                f"dl2 {o.get('dl2_rss_mib')}",
                flush=True,
            )
    return overhead
