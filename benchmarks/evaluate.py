"""Evaluation benchmark: dl2 on ground-truthed cases and real workloads, with anchors.

``python -m benchmarks eval [--quick] [--filter=SUBSTR ...] [--anchors] [--jobs=N] [--docs]``

1. Every case of ``benchmarks/cases`` (synthetic) and ``benchmarks/workloads``
   (transformers models under DDP / FSDP2 / pipeline / tensor parallelism) runs once
   under ``dl2 run --hang-timeout 30 --json ... -n WORLD case.py`` (hard timeout per
   run; ``--jobs`` runs at a time, 2 by default: on 2 cores the latencies below are
   then measured beside a neighbour's load, which can only lengthen them).  Its
   verdict is compared with the case's header (``cases/README.md``):

   * positive = a ``deadlock`` or ``defect`` verdict; precision and recall count a
     positive as correct when the label is ``deadlock`` or ``defect``;
   * verdict match: the verdict equals the label (a nondeterministic case also accepts
     ``defect``: dl2's potential-deadlock finding on a run where the race went well);
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

Prints one table, appends the run to ``benchmarks/results/results.jsonl`` and, for a
full run (no ``--quick`` / ``--filter``, or with ``--docs``), rewrites the ``eval``
section of ``docs/benchmarks.md``.  Under ``python -m benchmarks``, give option values
with ``=`` (``--filter=send_send``, ``--pairs=1``): its argument splitting takes a bare
value for a suite name.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import pickle
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from dataclasses import fields
from pathlib import Path
from typing import Any

from benchmarks._harness import BENCH
from benchmarks._harness import REPO
from benchmarks._harness import Case
from benchmarks._harness import PlainRun
from benchmarks._harness import discover
from benchmarks._harness import kill_group
from benchmarks._harness import launch

DL2 = REPO / ".venv" / "bin" / "dl2"
RESULTS = BENCH / "results" / "results.jsonl"
DOCS = REPO / "docs" / "benchmarks.md"
FR_HOOK_DIR = BENCH / "_anchor_fr"
START, END = "<!-- eval:start -->", "<!-- eval:end -->"

#: ``dl2 run --hang-timeout``: a job with no progress this long is stopped and analysed
HANG_TIMEOUT_S = 30
#: hard limit of one ``dl2 run`` (process group killed past it)
RUN_TIMEOUT_S = 90
#: anchors: a run still going after this long is a hang (and the FR dump is taken then);
#: the workloads get ``WORKLOAD_CAP_S`` (importing transformers took up to 25 s on a
#: loaded 2-core machine)
ANCHOR_CAP_S = 30.0
WORKLOAD_CAP_S = 90.0
#: FR anchor: time allowed after the cap for the ranks to write their dumps
FR_DUMP_GRACE_S = 40.0
#: anchors: at most this many rank processes alive at once (memory), over all workers
ANCHOR_RANK_BUDGET = 20
#: steps the clean workloads run when their step time is measured
OVERHEAD_STEPS = 60
WARMUP_STEPS = 3

#: the ``--quick`` subset: one or two per kind of bug, and one workload
QUICK = (
    "send_send__2ranks",
    "recv_recv__ok_send_first",
    "collective_order__2ranks",
    "collective_skipped__early_exit",
    "count_mismatch__4_vs_8",
    "reduce_op_mismatch__sum_max",
    "nonmember_call__3ranks",
    "object_subset__ok_all_ranks",
    "batch_p2p__missing_irecv",
    "p2p_collective_order__ok_isend_barrier",
    "dtype_mismatch__p2p_float_int",
    "wildcard__race_any_then_named",
    "early_stop__ok_all_reduce_flag",
    "ddp_gpt2__ok_train",
    "ddp_gpt2__uneven_data",
)


# -- dl2 on one case --------------------------------------------------------------------


@dataclass
class Dl2Result:
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


def _last_progress_ns(run_dir: Path) -> int | None:
    """The latest ``t`` of any op/ret/wait/done record in the run's traces."""
    last = None
    for trace in run_dir.glob("*.dl2.jsonl"):
        with contextlib.suppress(OSError):
            for line in trace.read_text(errors="replace").splitlines():
                if '"k":"state"' in line or '"k":"header"' in line or '"k":"end"' in line:
                    continue
                match = re.search(r'"t":(\d+)', line)
                if match:
                    t = int(match.group(1))
                    last = t if last is None or t > last else last
    return last


def _kill_leftover_ranks(run_dir: Path, script: Path) -> None:
    """SIGKILL rank processes of this run still alive (trace files name their pids)."""
    for trace in run_dir.glob("rank*.dl2.jsonl"):
        parts = trace.name.split(".")
        if len(parts) < 3 or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(script).encode() in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _finding_ops(report: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for finding in report.get("findings", []):
        yield from finding.get("ops", [])


def run_dl2(case: Case, workdir: Path, log_dir: Path | None = None, steps: int = 0) -> Dl2Result:
    """One ``dl2 run`` of ``case``; its report compared with the header."""
    run_dir = workdir / f"run-{case.name}"
    report_path = workdir / f"{case.name}.json"
    out_path = workdir / f"{case.name}.log"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if log_dir is not None:
        env["DL2_BENCH_LOG"] = str(log_dir)
        env["DL2_BENCH_STEPS"] = str(steps)
    cmd = [
        str(DL2),
        "run",
        "--hang-timeout",
        str(HANG_TIMEOUT_S),
        "--run-dir",
        str(run_dir),
        "--json",
        str(report_path),
        "-n",
        str(case.world),
        str(case.path),
    ]
    note = ""
    start = time.monotonic()
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
            note = f"no verdict: dl2 run stopped after {RUN_TIMEOUT_S} s"
            lines = [ln for ln in out_path.read_text(errors="replace").splitlines() if ln.strip()]
            if lines:
                note += f" (dl2's last output: {lines[-1].strip()[:160]})"
            # SIGTERM first: dl2 then stops the ranks it started (each in a session of
            # its own, out of reach of the group kill below).
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=20)
        finally:
            kill_group(proc.pid)
            proc.wait()
            _kill_leftover_ranks(run_dir, case.path)
    end_ns = time.monotonic_ns()
    wall = time.monotonic() - start
    if code is None:
        report_path.unlink(missing_ok=True)  # what dl2 said once interrupted is not scored
    report: dict[str, Any] = {}
    if report_path.exists():
        try:
            report = json.loads(report_path.read_text())
        except ValueError as err:
            note = note or f"unreadable report: {err}"
    elif not note:
        tail = out_path.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        note = f"no JSON report (exit {code}): {tail[0][:120]}"
    meta: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        meta = json.loads((run_dir / "run.json").read_text())
    last = _last_progress_ns(run_dir)
    to_exit = (end_ns - last) / 1e9 if last is not None and code is not None else None
    detected_after = meta.get("detected_after")
    latency = detected_after if isinstance(detected_after, (int, float)) else to_exit

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
    positive = verdict in ("deadlock", "defect")
    accepted = {case.label} | ({"defect"} if case.nondeterministic else set())
    culprit_ok = None
    if case.positive:
        culprit_ok = positive and set(named) >= case.ranks and not missing
    return Dl2Result(
        case=case.name,
        suite=case.suite,
        category=case.category,
        label=case.label,
        nondeterministic=case.nondeterministic,
        verdict=verdict,
        exit_code=code,
        wall_s=round(wall, 2),
        latency_s=None if latency is None else round(latency, 2),
        last_record_to_exit_s=None if to_exit is None else round(to_exit, 2),
        detected_after_s=detected_after if isinstance(detected_after, (int, float)) else None,
        reason=meta.get("reason"),
        findings=findings,
        named_ranks=named,
        missing_lines=missing,
        positive=positive,
        verdict_ok=verdict in accepted,
        culprit_ok=culprit_ok,
        note=note,
        job_exit_code=meta.get("job_exit_code"),
    )


# -- overhead on the clean workloads ------------------------------------------------------


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


# -- anchors ----------------------------------------------------------------------------

DETAIL_PATTERNS = (
    re.compile(r"Detected mismatch between collectives"),
    re.compile(r"failed to pass monitoredBarrier"),
)
_RANK_WORD = re.compile(r"\b[Rr]anks?\s+(\d+(?:\s*,\s*\d+)*)")


@dataclass
class AnchorResult:
    anchor: str
    case: str
    outcome: str
    time_s: float | None
    detected: bool
    culprit: bool | None
    named: list[int] = field(default_factory=list)
    evidence: str = ""


class _RankBudget:
    """Caps the number of rank processes alive over all anchor workers."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.cond = threading.Condition()

    @contextlib.contextmanager
    def take(self, n: int) -> Any:
        n = min(n, self.budget)
        with self.cond:
            while self.used + n > self.budget:
                self.cond.wait()
            self.used += n
        try:
            yield
        finally:
            with self.cond:
                self.used -= n
                self.cond.notify_all()


def _ranks_in(text: str) -> set[int]:
    ranks: set[int] = set()
    for match in _RANK_WORD.finditer(text):
        ranks.update(int(x) for x in re.split(r"\s*,\s*", match.group(1)))
    return ranks


def anchor_cap(case: Case) -> float:
    return WORKLOAD_CAP_S if case.suite == "workloads" else ANCHOR_CAP_S


def anchor_plain(case: Case) -> AnchorResult:
    run = launch(case.path, case.world, anchor_cap(case))
    shutil.rmtree(run.outdir, ignore_errors=True)
    first_error = run.first_signal_at()
    detected = first_error is not None
    return AnchorResult(
        "plain",
        case.name,
        run.outcome,
        None if first_error is None else round(first_error, 2),
        detected,
        None,
        evidence=_first_error_line(run) or run.describe(),
    )


def _first_error_line(run: PlainRun) -> str:
    for rank in sorted(run.logs):
        for line in run.logs[rank].splitlines():
            if "Error" in line:
                return line.strip()[:200]
    return ""


def anchor_detail(case: Case) -> AnchorResult:
    run = launch(case.path, case.world, anchor_cap(case), {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    shutil.rmtree(run.outdir, ignore_errors=True)
    hits = [
        line
        for rank in sorted(run.logs)
        for line in run.logs[rank].splitlines()
        if any(p.search(line) for p in DETAIL_PATTERNS)
    ]
    named: set[int] = set()
    for line in hits:
        named |= _ranks_in(line)
    first_error = run.first_signal_at()
    return AnchorResult(
        "detail",
        case.name,
        run.outcome,
        None if first_error is None else round(first_error, 2),
        bool(hits),
        (bool(hits) and named >= case.ranks) if case.positive else None,
        sorted(named),
        (hits[0] if hits else _first_error_line(run) or run.describe())[:300],
    )


_FR_LOCK = threading.Lock()


def fr_repair(src: Path, dst: Path, world: int) -> None:
    """Copy the rank dumps of ``src`` to ``dst`` with ``pg_config`` filled from the entries.

    torch 2.13's gloo records ``pg_config`` as one entry ``{"": {"name": "", "desc": "",
    "ranks": <ranks of the group created last>}}`` while entries name their group
    ``("0", "default_pg")``, ``("1", "undefined")``, ...; the analyser then fails on the
    lookup.  Each group seen in the entries gets a config: the default group all
    ``world`` ranks, any other group the ranks whose entries use it.
    """
    dumps = {}
    for path in src.glob("rank_*"):
        if path.suffix == ".tmp":
            continue
        with contextlib.suppress(Exception):
            dumps[path] = pickle.loads(path.read_bytes())
    members: dict[tuple[str, str], set[int]] = {}
    for path, dump in dumps.items():
        rank = int(path.name.rsplit("_", 1)[1])
        for entry in dump.get("entries", []):
            members.setdefault(tuple(entry["process_group"]), set()).add(rank)
    dst.mkdir(parents=True, exist_ok=True)
    for path, dump in dumps.items():
        config = {}
        for (name, desc), ranks in members.items():
            group = list(range(world)) if desc == "default_pg" else sorted(ranks)
            config[name] = {"name": name, "desc": desc, "ranks": str(group)}
        dump["pg_config"] = config
        (dst / path.name).write_bytes(pickle.dumps(dump))


def _torchfrtrace(trace_dir: Path, incomplete: bool) -> str:
    """Run torch's Flight Recorder analyser in process; its log output (or its error)."""
    from torch.distributed.flight_recorder import fr_trace

    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    fr_logger = logging.getLogger("Flight Recorder")
    args = [str(trace_dir), "-p", "rank_"] + (["--allow-incomplete-ranks"] if incomplete else [])
    with _FR_LOCK:
        fr_logger.addHandler(handler)
        saved = list(fr_logger.handlers)
        for other in saved:
            if other is not handler:
                fr_logger.removeHandler(other)
        try:
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                fr_trace.main(args)
        except BaseException as err:  # the analyser raises AssertionError, KeyError, ...
            buffer.write(f"\nANALYSER FAILED: {type(err).__name__}: {err}\n")
        finally:
            for other in saved:
                if other is not handler:
                    fr_logger.addHandler(other)
            fr_logger.removeHandler(handler)
    return buffer.getvalue()


def anchor_fr(case: Case) -> AnchorResult:
    dump_dir = Path(tempfile.mkdtemp(prefix="dl2-bench-fr-"))
    state = dump_dir / "state"
    state.mkdir()
    trigger = state / "TRIGGER"
    env = {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": str(dump_dir / "rank_"),
        "BENCH_FR_TRIGGER": str(trigger),
        "BENCH_FR_STATE": str(state),
        "PYTHONPATH": os.pathsep.join(
            [str(FR_HOOK_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    trigger_at = anchor_cap(case)

    def finishing(alive: list[int]) -> bool:
        return all((state / f"destroy.{r}").exists() for r in alive)

    def tick(elapsed: float, codes: dict[int, int | None]) -> bool:
        alive = [r for r, c in codes.items() if c is None]
        dumped_all = all((state / f"dumped.{r}").exists() for r in alive)
        if not trigger.exists() and finishing(alive):
            # Every live rank passed destroy_process_group and wrote its dump: the job
            # is finishing.  The dump imported many modules to symbolise stacks, and
            # interpreter shutdown then took over 15 s on the loaded machine, so stop
            # here rather than wait (the run counts as exit 0 below).
            return dumped_all
        if elapsed >= trigger_at and not trigger.exists():
            trigger.touch()
        if trigger.exists():
            return dumped_all
        return False

    run = launch(
        case.path, case.world, trigger_at + FR_DUMP_GRACE_S, env, on_tick=tick, grace_after_tick=1.0
    )
    outcome = run.outcome
    stopped = [r for r, c in run.codes.items() if c is None]
    if (
        outcome == "hang"
        and not trigger.exists()
        and finishing(stopped)
        and all(c == 0 for c in run.codes.values() if c is not None)
    ):
        outcome = "exit 0"
    dumped = sorted(int(p.name.split("_")[1]) for p in dump_dir.glob("rank_*") if p.suffix == "")
    why = {}
    for rank in dumped:
        with contextlib.suppress(OSError):
            why[rank] = (state / f"dumped.{rank}").read_text()
    incomplete = len(dumped) < case.world
    raw = _torchfrtrace(dump_dir, incomplete) if dumped else "no dump"
    repaired = ""
    if dumped:
        fixed = dump_dir / "repaired"
        fr_repair(dump_dir, fixed, case.world)
        repaired = _torchfrtrace(fixed, incomplete)
    detected = "has errors" in repaired or "Not all ranks joining" in repaired
    named: set[int] = set()
    for match in re.finditer(r"Culprit rank (\d+)", repaired):
        named.add(int(match.group(1)))
    for match in re.finditer(r"missing ranks: \{([\d, ]+)\}", repaired):
        named |= {int(x) for x in match.group(1).split(",") if x.strip()}
    raw_failed = re.search(r"ANALYSER FAILED: (.*)", raw)
    lines = [
        ln.strip()
        for ln in repaired.splitlines()
        if "error msg" in ln or "Not all ranks" in ln or "missing ranks" in ln
    ]
    evidence = (
        f"dumps {why or dumped}; raw: {raw_failed.group(1)[:80] if raw_failed else 'ok'}; "
        f"repaired: {(lines[0] if lines else 'no error')[:160]}"
    )
    shutil.rmtree(dump_dir, ignore_errors=True)
    shutil.rmtree(run.outdir, ignore_errors=True)
    return AnchorResult(
        "fr",
        case.name,
        outcome,
        round(min(run.wall, trigger_at), 2) if outcome == "hang" else round(run.wall, 2),
        detected,
        (detected and named >= case.ranks) if case.positive else None,
        sorted(named),
        evidence,
    )


ANCHORS = {"plain": anchor_plain, "detail": anchor_detail, "fr": anchor_fr}


def run_anchors(cases: list[Case], jobs: int) -> list[AnchorResult]:
    budget = _RankBudget(ANCHOR_RANK_BUDGET)
    results: list[AnchorResult] = []
    lock = threading.Lock()

    def one(case: Case, anchor: str) -> None:
        with budget.take(case.world):
            try:
                result = ANCHORS[anchor](case)
            except Exception as err:  # keep the evaluation going
                result = AnchorResult(anchor, case.name, "error", None, False, None, [], repr(err))
        with lock:
            results.append(result)
            flag = "det" if result.detected else "   "
            print(
                f"  anchor {anchor:6} {case.name:45} {result.outcome:7} {flag} "
                f"{result.evidence[:70]}",
                flush=True,
            )

    # longest first: the 8-rank and workload runs, then by world size
    order = sorted(cases, key=lambda c: (c.suite != "workloads", -c.world))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, case, anchor) for case in order for anchor in ANCHORS]
        for future in futures:
            future.result()
    return results


# -- aggregation and output ----------------------------------------------------------------


def _pct(num: int, den: int) -> str:
    return "–" if den == 0 else f"{100 * num / den:.0f}%"


def _frac(num: int, den: int) -> str:
    return "–" if den == 0 else f"{num}/{den}"


def _lat(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{statistics.median(values):.1f}/{max(values):.1f}"


def _group_stats(
    results: list[Dl2Result], anchors: dict[tuple[str, str], AnchorResult] | None
) -> dict[str, Any]:
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
        for name in ANCHORS:
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
            stats[name] = {
                "detected": det_pos,
                "false_alarms": fa,
                "culprit": cul,
                "times": times,
                "ok_runs_failed": broken,
            }
    return stats


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
        header += ["plain: fails (FA)", "DETAIL: det/culprit (FA)", "FR: det/culprit (FA)"]
    rows = []
    groups: dict[str, list[Dl2Result]] = {}
    for r in results:
        key = f"{r.category}" + (" (workloads)" if r.suite == "workloads" else "")
        groups.setdefault(key, []).append(r)
    summary: dict[str, Any] = {}

    def row(name: str, members: list[Dl2Result], bold: bool = False) -> list[str]:
        s = _group_stats(members, anchors)
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
            p, d, f = s["plain"], s["detail"], s["fr"]
            cells += [
                f"{_frac(p['detected'], s['positives'])} ({p['false_alarms']})",
                f"{_frac(d['detected'], s['positives'])} / {d['culprit']} ({d['false_alarms']})",
                f"{_frac(f['detected'], s['positives'])} / {f['culprit']} ({f['false_alarms']})",
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
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines), summary


def summary_all(results: list[Dl2Result], anchors: list[AnchorResult]) -> dict[str, Any]:
    return _group_stats(results, {(a.anchor, a.case): a for a in anchors})


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
    out = []
    for r in results:
        bad = (r.label == "ok" and (r.positive or not r.verdict_ok)) or (
            r.label != "ok" and (not r.positive or not r.verdict_ok or not r.culprit_ok)
        )
        if bad or r.note:
            out.append(f"`{r.case}` ({r.label}): {_miss_reason(r)}")
    return out


def overhead_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | steps × pairs | plain step ms | dl2 step ms | step-time ratio (range) "
        "| peak RSS plain MiB | peak RSS dl2 MiB | RSS ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in rows:
        spread = f" ({o['ratio_min']}–{o['ratio_max']})" if "ratio_min" in o else ""
        lines.append(
            f"| `{o['case']}` | {o['steps_per_run']} × {o['pairs']} | "
            f"{o.get('plain_step_ms', '–')} | {o.get('dl2_step_ms', '–')} | "
            f"{o.get('ratio', '–')}{spread} | {o.get('plain_rss_mib', '–')} | "
            f"{o.get('dl2_rss_mib', '–')} | {o.get('rss_ratio', '–')} |"
        )
    return "\n".join(lines)


def _git_commit() -> str:
    with contextlib.suppress(Exception):
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() + ("+dirty src" if dirty.stdout.strip() else "")
    return "?"


def update_docs(section: str) -> None:
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
    miss = misses(results)
    parts = [
        "## Evaluation: dl2 on ground-truthed cases and real workloads",
        "",
        f"Command: `{command}` (took {elapsed / 60:.1f} min on this machine, "
        f"{os.cpu_count()} cores; {stamp}, commit {commit}).",
        "",
        "What the columns mean (full definitions in `benchmarks/evaluate.py` and "
        "`benchmarks/cases/README.md`): *cases* counts labels deadlock/defect/ok; a positive "
        "is a `deadlock` or `defect` verdict of `dl2 run --hang-timeout "
        f"{HANG_TIMEOUT_S}`; *verdict = label* also accepts `defect` for nondeterministic "
        "cases; *exact culprit* = findings name ⊇ the expected ranks and every "
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
        for name in ANCHORS:
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
            + "; ".join(f"{name} {_lat(times.get(name, []))}" for name in ANCHORS)
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
    head = "| case | label | dl2 verdict | culprit | latency s |"
    rule = "|---|---|---|---|---|"
    if anchors:
        head += " plain | DETAIL | FR |"
        rule += "---|---|---|"
    lines = ["<details><summary>Per-case results</summary>", "", head, rule]
    for r in results:
        culprit = "–" if r.culprit_ok is None else ("yes" if r.culprit_ok else "no")
        lat = "–" if r.latency_s is None else f"{r.latency_s:.1f}"
        nd = " (nd)" if r.nondeterministic else ""
        row = f"| `{r.case}` | {r.label}{nd} | {r.verdict or 'none'} | {culprit} | {lat} |"
        if anchors:
            for name in ANCHORS:
                a = amap.get((name, r.case))
                if a is None:
                    row += " – |"
                    continue
                mark = " **det**" if a.detected else ""
                mark += f" {a.named}" if a.named and a.anchor != "plain" else ""
                row += f" {a.outcome}{mark} |"
        lines.append(row)
    lines += ["", "</details>"]
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------


def render_last() -> int:
    """Re-render the table and the docs section from the last record of results.jsonl."""
    if not RESULTS.exists():
        print(f"eval: no {RESULTS.relative_to(REPO)}")
        return 2
    lines = [ln for ln in RESULTS.read_text().splitlines() if ln.strip()]
    record = json.loads(lines[-1])
    known = {f.name for f in fields(Dl2Result)}  # older records carry retired keys
    results = [Dl2Result(**{k: v for k, v in c.items() if k in known}) for c in record["cases"]]
    anchors = [AnchorResult(**a) for a in record["anchors"]] if record.get("anchors") else None
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


def main(argv: list[str] | None = None) -> int:
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
    args = parser.parse_args(argv)
    if args.render_last:
        return render_last()
    if not DL2.exists():
        print(f"eval: {DL2} not found (make install)")
        return 2
    t0 = time.monotonic()
    cases = discover()
    if args.quick:
        cases = [c for c in cases if c.name in QUICK]
    if args.filter:
        cases = [c for c in cases if any(f in c.name for f in args.filter)]
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

    def one(case: Case) -> Dl2Result:
        result = run_dl2(case, workdir)
        ok = "ok " if result.verdict_ok and result.culprit_ok is not False else "BAD"
        lat = "" if result.latency_s is None else f" latency {result.latency_s:.1f}s"
        print(
            f"  {ok} {case.name:45} {case.label:8} -> {result.verdict!s:9} "
            f"wall {result.wall_s:5.1f}s{lat} {result.note}",
            flush=True,
        )
        return result

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(one, cases))
    phases = {"dl2 runs": time.monotonic() - t0}

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
    print(
        f"\neval: done in {elapsed / 60:.1f} min ("
        + ", ".join(f"{name} {secs / 60:.1f}" for name, secs in phases.items())
        + ")"
    )

    record = {
        "time": stamp,
        "commit": _git_commit(),
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
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
    write_docs = args.docs if args.docs is not None else not (args.quick or args.filter)
    if write_docs:
        update_docs(
            docs_section(
                command, table, results, overhead, anchor_results, elapsed, stamp, record["commit"]
            )
        )
        print(f"eval: wrote {DOCS.relative_to(REPO)}")
    print(f"eval: appended this run to {RESULTS.relative_to(REPO)}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
