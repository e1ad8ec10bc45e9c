"""Evaluation benchmark: dl2 on ground-truthed cases and real workloads, with anchors.

``python -m benchmarks eval [--quick] [--filter=SUBSTR ...] [--anchors] [--jobs=N] [--docs]``

1. Every case of ``benchmarks/cases`` (synthetic) and ``benchmarks/workloads``
   (transformers models under DDP / FSDP2 / pipeline / tensor parallelism) runs once
   under ``dl2 run --hang-timeout 30 --json ... -n WORLD case.py`` (hard timeout per
   run; ``--jobs`` runs at a time, 2 by default: on 2 cores the latencies below are
   then measured beside a neighbour's load, which can only lengthen them).  Its
   verdict is compared with the case's header (``cases/README.md``):

   * positive = a ``deadlock``, ``hang`` or ``defect`` verdict; precision and recall
     count a positive as correct when the label is ``deadlock`` or ``defect``;
   * verdict match: the verdict equals the label (a nondeterministic case also accepts
     ``defect``: dl2's potential-deadlock finding on a run where the race went well; a
     ``deadlock`` case also accepts ``hang``: the job hangs because a rank waits outside
     communication, and dl2 names who waits on whom);
   * a case whose header has ``interrupt=S`` hangs where dl2's hang timeout does not
     apply (a rank waits outside communication): SIGINT goes to dl2 S seconds in, as a
     user at the terminal would send it, and the report it then writes is scored (its
     latency: from the SIGINT to dl2's exit);
   * exact culprit: the ranks named by the findings ⊇ the header's ranks, and every
     ``# dl2: culprit`` line is the (file, line) of some op of some finding;
   * verdict latency: for a deadlock proven live, dl2's own ``detected_after`` from
     ``run.json`` (last progress of the deadlocked ranks to the proof); otherwise the
     time from the last record any rank wrote to its trace (the job stopped making
     progress, or ended) to dl2's exit, both on the host's monotonic clock (this
     includes stopping the job and the post-mortem analysis); wall: launch to exit.

2. The clean workloads also measure what recording costs: each logs its per-step wall
   times and peak RSS (``_common.StepLog``) in fresh runs after step 1, back to back in
   pairs whose order alternates (dl2 then plain, plain then dl2, ...: 2 pairs of 60
   steps, ``--quick`` 1 pair of 30), so slow drift of the machine hits both sides.  A
   pair's ratio is the median step time of its dl2 run over that of its plain run
   (first 3 steps of each run dropped); the overhead is the median of the pair ratios,
   shown with their range.  Memory: the largest ``ru_maxrss`` of any rank, dl2 runs vs
   plain runs.

3. ``--anchors``: the same cases without dl2, as a user would debug them today
   (``ANCHOR_CAP_S`` = 30 s cap per run, 90 s for the workloads; runs in parallel):

   * ``plain``: gloo defaults.  detected = within the cap some rank exits non-zero or
     prints a traceback / glog error line (the user sees *that* something failed; gloo
     never names a culprit rank);
   * ``detail``: ``TORCH_DISTRIBUTED_DEBUG=DETAIL``.  detected = a rank's output holds
     one of DETAIL's diagnostics (``Detected mismatch between collectives``,
     ``failed to pass monitoredBarrier``); culprit = the ranks those lines name ⊇ the
     header's ranks;
   * ``fr``: Flight Recorder (``TORCH_FR_BUFFER_SIZE=2000``).  gloo never writes a dump
     by itself in torch 2.13, so a hook (``_anchor_fr/sitecustomize.py``) writes
     torch's on-demand dump ``_dump_fr_trace()`` at the cap (a watchdog timeout), at an
     uncaught exception and at ``destroy_process_group``.  ``torchfrtrace`` as shipped
     fails on every gloo dump (``KeyError`` in ``build_collectives``: gloo leaves
     ``pg_config`` empty), so the dumps are analysed after filling ``pg_config`` from
     the entries (``fr_repair``); both attempts are recorded.  detected = the analyser
     reports ``has errors`` or ``Not all ranks joining``; culprit = the ranks of its
     ``Culprit rank N`` / ``missing ranks`` lines ⊇ the header's ranks.
   * ``fr-dl2``: dl2 itself (``dl2 analyze``) on the same dumps, as they were written
     (no repair): detected = a deadlock, hang or defect verdict; culprit as for dl2's own
     runs (the ranks and every ``# dl2: culprit`` line); cycle = a deadlock finding
     names its wait cycle.

Prints one table, appends the run to ``benchmarks/results/results.jsonl`` and, for a
full run (no ``--quick`` / ``--filter``, or with ``--docs``), rewrites the ``eval``
section of ``docs/benchmarks.md``.  Under ``python -m benchmarks``, give option values
with ``=`` (``--filter=send_send``, ``--pairs=1``): its argument splitting takes a bare
value for a suite name.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks._harness import DL2
from benchmarks._harness import REPO
from benchmarks.evaluation.anchors import ANCHOR_CAP_S
from benchmarks.evaluation.anchors import ANCHORS
from benchmarks.evaluation.anchors import WORKLOAD_CAP_S
from benchmarks.evaluation.anchors import run_anchors
from benchmarks.evaluation.cases import select_cases
from benchmarks.evaluation.dl2_runs import HANG_TIMEOUT_S
from benchmarks.evaluation.dl2_runs import run_cases
from benchmarks.evaluation.overhead import OVERHEAD_STEPS
from benchmarks.evaluation.overhead import run_overhead
from benchmarks.evaluation.results import RESULTS
from benchmarks.evaluation.results import AnchorResult
from benchmarks.evaluation.results import Dl2Result
from benchmarks.evaluation.results import append_record
from benchmarks.evaluation.results import git_commit
from benchmarks.evaluation.results import last_record
from benchmarks.evaluation.scoring import misses
from benchmarks.evaluation.scoring import nondeterministic_summary
from benchmarks.evaluation.scoring import summary_all
from benchmarks.evaluation.tables import DOCS
from benchmarks.evaluation.tables import build_table
from benchmarks.evaluation.tables import docs_section
from benchmarks.evaluation.tables import overhead_table
from benchmarks.evaluation.tables import update_docs


def render_last() -> int:
    """Re-render the table and the docs section from the last record of results.jsonl."""
    last = last_record()
    if last is None:
        print(f"eval: no {RESULTS.relative_to(REPO)}")
        return 2
    record, results, anchors = last
    anchor_map = {(a.anchor, a.case): a for a in anchors} if anchors else None
    table, _ = build_table(results, anchor_map)
    print(table)
    section = docs_section(
        record["command"],
        table,
        results,
        record.get("overhead") or [],
        anchors,
        record["elapsed_s"],
        record["time"],
        record["commit"],
    )
    update_docs(section)
    print(f"eval: rewrote {DOCS.relative_to(REPO)} from the run of {record['time']}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks eval", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a subset that runs in < 5 min")
    parser.add_argument("--filter", action="append", default=[], help="case name substring")
    parser.add_argument("--anchors", action="store_true", help="also run the anchors")
    parser.add_argument("--jobs", type=int, default=2, help="dl2 runs at once (default 2)")
    parser.add_argument("--anchor-jobs", type=int, default=8, help="anchor runs at once")
    parser.add_argument("--pairs", type=int, default=None, help="overhead dl2/plain pairs")
    parser.add_argument(
        "--docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rewrite the eval section of docs/benchmarks.md (default: only for a full run, "
        "without --quick or --filter)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--render-last",
        action="store_true",
        help="run nothing: print the table of the last run in results.jsonl and rewrite docs",
    )
    return parser


def _print_summary(
    table: str,
    results: list[Dl2Result],
    overhead: list[dict[str, Any]],
    anchor_results: list[AnchorResult] | None,
) -> None:
    print()
    print(table)
    if overhead:
        print()
        print(overhead_table(overhead))
    print()
    for m in misses(results) or ["no dl2 miss"]:
        print(f"  miss: {m}")
    if nd := nondeterministic_summary(results):
        print(f"  {nd}")
    if anchor_results:
        total = summary_all(results, anchor_results)
        for name in ANCHORS:
            if total[name]["ok_runs_failed"]:
                print(
                    f"  {name} anchor: correct cases that failed: {total[name]['ok_runs_failed']}"
                )


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation (see the module docstring); the exit status."""
    args = _parser().parse_args(argv)
    if args.render_last:
        return render_last()
    if not DL2.exists():
        print(f"eval: {DL2} not found (make install)")
        return 2
    t0 = time.monotonic()
    cases = select_cases(args.quick, args.filter)
    if not cases:
        print("eval: no case selected")
        return 2
    pairs = args.pairs if args.pairs is not None else (1 if args.quick else 2)
    steps = 30 if args.quick else OVERHEAD_STEPS
    workdir = Path(tempfile.mkdtemp(prefix="dl2-bench-eval-"))
    print(
        f"eval: {len(cases)} cases ({sum(c.suite == 'workloads' for c in cases)} workloads), "
        f"dl2 {DL2}, work dir {workdir}",
        flush=True,
    )
    results = run_cases(cases, workdir, args.jobs)
    phases = {"dl2 runs": time.monotonic() - t0}
    overhead = run_overhead(cases, workdir, pairs, steps)
    phases["overhead"] = time.monotonic() - t0 - sum(phases.values())
    anchor_results: list[AnchorResult] | None = None
    if args.anchors:
        print(
            f"anchors: {len(cases)} cases × {len(ANCHORS)}, cap {ANCHOR_CAP_S:.0f} s "
            f"({WORKLOAD_CAP_S:.0f} s for workloads)",
            flush=True,
        )
        anchor_results = run_anchors(cases, args.anchor_jobs)
        phases["anchors"] = time.monotonic() - t0 - sum(phases.values())
    anchor_map = {(a.anchor, a.case): a for a in anchor_results} if anchor_results else None

    table, summary = build_table(results, anchor_map)
    elapsed = time.monotonic() - t0
    command = "python -m benchmarks eval" + "".join(
        [" --quick" if args.quick else "", " --anchors" if args.anchors else ""]
        + [f" --filter={f}" for f in args.filter]
    )
    stamp = time.strftime("%Y-%m-%d %H:%M")
    _print_summary(table, results, overhead, anchor_results)
    print(
        f"\neval: done in {elapsed / 60:.1f} min ("
        + ", ".join(f"{name} {secs / 60:.1f}" for name, secs in phases.items())
        + ")"
    )

    commit = git_commit()
    record = {
        "time": stamp,
        "commit": commit,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "command": command,
        "elapsed_s": round(elapsed, 1),
        "phases_s": {name: round(secs, 1) for name, secs in phases.items()},
        "hang_timeout_s": HANG_TIMEOUT_S,
        "anchor_cap_s": ANCHOR_CAP_S if args.anchors else None,
        "summary": summary,
        "cases": [asdict(r) for r in results],
        "overhead": overhead,
        "anchors": [asdict(a) for a in anchor_results] if anchor_results else None,
    }
    append_record(record)
    write_docs = args.docs if args.docs is not None else not (args.quick or args.filter)
    if write_docs:
        update_docs(
            docs_section(command, table, results, overhead, anchor_results, elapsed, stamp, commit)
        )
        print(f"eval: wrote {DOCS.relative_to(REPO)}")
    print(f"eval: appended this run to {RESULTS.relative_to(REPO)}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
