"""Ground-truth the benchmark cases under plain gloo, without dl2.

Usage::

    .venv/bin/python -m benchmarks.groundtruth [--hang 30] [--repeat N] [-j JOBS] [NAME ...]

Each case (``benchmarks/cases`` and ``benchmarks/workloads``; NAME filters by substring)
is launched ``--repeat`` times (nondeterministic cases: ``--repeat-nondet`` times) by
:func:`benchmarks._harness.launch`: one process per rank, env like torchrun, gloo on
127.0.0.1, ``OMP_NUM_THREADS=1``.  A run still hanging after ``--hang`` seconds is a
hang (killed then).  Prints one markdown table row per case: what plain gloo did and
whether that agrees with the label (``deadlock``: every run hangs, or for a
nondeterministic case at least one; ``defect``: no run hangs; ``ok``: every run exits 0).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from benchmarks._harness import Case
from benchmarks._harness import discover
from benchmarks._harness import launch


def _observe(case: Case, hang: float, repeat: int, verbose: bool) -> tuple[str, bool]:
    outcomes: Counter[str] = Counter()
    details = []
    walls = []
    for _ in range(repeat):
        run = launch(case.path, case.world, hang)
        outcomes[run.outcome] += 1
        if run.outcome != "hang":
            walls.append(run.wall)
        details.append(run.describe())
        if verbose or run.outcome == "crash":
            errors = [
                f"r{r}| {line[:160]}"
                for r, text in run.logs.items()
                for line in text.splitlines()
                if "Error" in line or "error" in line or "Warning" in line
            ]
            details.extend(errors[-4:])
        shutil.rmtree(run.outdir, ignore_errors=True)
    label = case.label
    if label == "deadlock":
        agrees = outcomes["hang"] == repeat or (case.nondeterministic and outcomes["hang"] > 0)
    elif label == "defect":
        agrees = outcomes["hang"] == 0 or case.nondeterministic
    else:
        agrees = outcomes["exit 0"] == repeat
    summary = ", ".join(f"{k} ×{v}" for k, v in sorted(outcomes.items()))
    if walls:
        summary += f" (ended after {min(walls):.1f}–{max(walls):.1f} s)"
    else:
        summary += f" (still blocked at {hang:.0f} s)"
    nd = " nondeterministic" if case.nondeterministic else ""
    row = (
        f"| `{case.path.name}` | {label}{nd} | {case.world} | "
        f"{','.join(map(str, sorted(case.ranks))) or '–'} | {summary} |"
    )
    text = ("" if agrees else "DISAGREES ") + row
    if verbose or not agrees:
        text += "\n" + "\n".join(f"      {d}" for d in details)
    return text, agrees


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--hang", type=float, default=30.0, help="seconds that make a hang")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--repeat-nondet", type=int, default=10)
    parser.add_argument("-j", "--jobs", type=int, default=1)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    cases = [c for c in discover() if not args.names or any(n in c.name for n in args.names)]
    bad = 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(
                _observe,
                case,
                args.hang,
                args.repeat_nondet if case.nondeterministic else args.repeat,
                args.verbose,
            )
            for case in cases
        ]
        for future in futures:
            text, agrees = future.result()
            print(text, flush=True)
            bad += not agrees
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
