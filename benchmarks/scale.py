"""Long and large jobs: verdict latency after a long history, offline analysis throughput,
and the disk a long trace takes.

Run ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks scale [--quick] [OPTIONS]``.
Prints markdown tables (median and min-max of the runs) and appends one JSON line per
suite run to ``benchmarks/results/scale.jsonl``; ``--docs`` also rewrites the generated
part of the "Scale" section of ``docs/benchmarks.md``.  Three parts (``--only=history,
offline,disk``):

* **history**: ``scale_cases/history_sendsend.py N`` under ``dl2 run -n 2``: N healthy
  blocking all_reduces, then both ranks stamp ``DL2-BLOCK rank=R t=<time.time()>`` and
  send to each other (a send/send deadlock on gloo).  Verdict latency = run.json's
  ``verdict_wall_time`` minus the later stamp.  Also the job's wall time and the trace
  bytes per op.  N = 10^3, 10^4, 10^5, 10^6 (``--quick``: 10^3, 10^4); 10^6 is listed
  as not run when its predicted run time (a straight line through the job times of the
  two sizes before: the healthy history alone takes 0.5-1 ms per op here) exceeds the
  per-run timeout; ``--history-sizes`` and ``--history-timeout`` run it anyway.
* **offline**: synthetic run directories (``benchmarks/scale_traces.py``, written by the
  recorder's encoders) analysed by ``dl2 analyze --json`` in a fresh child: (a) 8 ranks x
  N blocking all_reduces, N = 10^4, 2x10^4, 4x10^4, 10^5, 10^6 (``--quick``: 10^4, 10^5);
  (b) R ranks x 100, R = 256, 512, 1,024 ... 8,192 (``--quick``: 256, 512, 1,024; the
  full run starts at 256 too, so that the growth shows when the larger sizes do not
  fit).  Every rank ends blocked: ranks 0 and 1 in a send/send cycle, the others in a
  barrier; (c) R ranks x 10, R = 1,024 ... 8,192 (``--quick``: 512, 1,024;
  ``--split-sizes``), split in halves at the last call: the lower half in an all_reduce,
  the upper half in a barrier at the same position of the world group, each rank waiting
  on the W/2 ranks of the other half (W^2/4 waits: the wait-for graph must not cost
  that).  A run counts only with exit status 3 and a JSON report whose deadlock
  finding has the cycle 0, 1 (for (c): 0, W/2) and the generated source lines; anything
  else is a failure, not a timing.  Wall time, records/s (records in the files / wall), records
  per CPU second (user + system, ``wait4``: a loaded machine stretches wall times) and
  the child's peak RSS (``wait4``).  Records are typed records: a blocking call is
  four (op, ret, wait, ret), written as two lines.
* **disk**: the disk one rank's trace takes after 10^6 blocking all_reduces recorded by
  dl2 with the default retention (``benchmarks/trace_size.py``: the real recorder, gloo
  replaced by an already complete work), and the history job's bytes per op.
Every child has a hard timeout (its process group is killed): ``--history-timeout``
(300 s, quick 120 s) per ``dl2 run``, ``--analyze-timeout`` (150 s, quick 60 s) per
``dl2 analyze``, which also runs under an address-space cap (``--mem-cap-gib``, default 6)
so that a run that would need more memory fails rather than swamping the machine.
Before each size the time and memory one run takes are predicted from the sizes before it
(the growth exponent of the last two, at least linear); a size predicted over the
timeout, the memory cap or the suite's time budget (``--budget-min``, 15 min, quick 5)
is printed as "not run" with the prediction, and the larger sizes of a sweep after a
timeout or a failure are not run.  Timings take 5 runs, 3 when the first run took over
20 s (the largest sizes); ``--quick`` takes 3 runs, 1 at the largest size of each sweep
(a smoke figure).  ``--runs=K`` forces K runs; ``--history-sizes``, ``--ops-sizes``,
``--rank-sizes`` and ``--split-sizes`` (comma-separated, ``1e6`` allowed) replace the
sizes; sizes given with
``--history-sizes`` run even when predicted over a cap.  ``--render-last`` runs nothing
and prints (with ``--docs``, writes) the tables of the last full run in scale.jsonl.
"""

from __future__ import annotations

import compileall
import datetime
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from benchmarks import scale_traces
from benchmarks._harness import BENCH
from benchmarks._harness import DL2
from benchmarks._harness import PYTHON
from benchmarks._harness import REPO
from benchmarks._harness import kill_group
from benchmarks._harness import markdown_table
from benchmarks._harness import start_logged
from dl2.trace.format import TRACE_SUFFIX
from dl2.trace.format import stream_of
from dl2.trace.format import trace_file_name

CASES = BENCH / "scale_cases"
HISTORY_SCRIPT = CASES / "history_sendsend.py"
RESULTS = BENCH / "results" / "scale.jsonl"
DOCS = REPO / "docs" / "benchmarks.md"
DOCS_START, DOCS_END = "<!-- scale:start -->", "<!-- scale:end -->"

HISTORY_SIZES = (10**3, 10**4, 10**5, 10**6)
HISTORY_SIZES_QUICK = (10**3, 10**4)
OPS_SIZES = (10**4, 2 * 10**4, 4 * 10**4, 10**5, 10**6)
OPS_SIZES_QUICK = (10**4, 10**5)
OPS_WORLD = 8
RANK_SIZES = (256, 512, 1024, 2048, 4096, 8192)
RANK_SIZES_QUICK = (256, 512, 1024)
RANK_OPS = 100
SPLIT_SIZES = (1024, 2048, 4096, 8192)
SPLIT_SIZES_QUICK = (512, 1024)
SPLIT_OPS = 10
DISK_OPS = 10**6

RUNS, RUNS_LONG, LONG_RUN_S = 5, 3, 20.0
#: per-run caps (seconds): a dl2 run of the history job, one dl2 analyze
HISTORY_TIMEOUT_S, HISTORY_TIMEOUT_QUICK_S = 300.0, 120.0
ANALYZE_TIMEOUT_S, ANALYZE_TIMEOUT_QUICK_S = 150.0, 60.0
MEM_CAP_GIB = 6.0
#: no size is started that is predicted to end past this many minutes from the start
BUDGET_MIN, BUDGET_MIN_QUICK = 15.0, 5.0

BLOCK = re.compile(r"DL2-BLOCK rank=(\d+) t=([0-9.]+)")
PID = re.compile(r"DL2-PID rank=(\d+) pid=(\d+)")
HISTORY = re.compile(r"DL2-HISTORY rank=(\d+) ops=(\d+) s=([0-9.]+)")


# -- figures ---------------------------------------------------------------------------------


def spread(values: list[float], fmt: str = "{:.2f}", unit: str = " s") -> str:
    """``median (min-max)`` of ``values``, or the one value."""
    if not values:
        return "-"
    med = fmt.format(statistics.median(values))
    if len(values) == 1:
        return f"{med}{unit}"
    return f"{med}{unit} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def power(n: int) -> str:
    """10^k for powers of ten, else the number with thousands separators."""
    k = round(math.log10(n)) if n > 0 else 0
    if 10**k == n and k >= 3:
        return f"10^{k}"
    mant = n / 10 ** math.floor(math.log10(n))
    if n >= 10**4 and mant == int(mant):
        return f"{int(mant)}x10^{math.floor(math.log10(n))}"
    return f"{n:,}"


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


@dataclass
class Attempt:
    """One size of a sweep: its runs, or why it has none.

    Attributes:
        size: the sweep's variable (N ops or R ranks).
        times: seconds per successful run (the sweep's timing figure).
        extra: per-run figures besides the time (name -> values).
        failures: one line per failed run (wrong or missing verdict, crash).
        timed_out: the cap a run hit, if one did.
        not_run: why the size was not run, if it was not.
        info: figures of the size itself (records, bytes, ...).
    """

    size: int
    times: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    timed_out: float | None = None
    not_run: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.extra.setdefault(name, []).append(value)

    @property
    def ok(self) -> bool:
        return bool(self.times) and not self.failures and self.timed_out is None


class Sweep:
    """Sizes run in increasing order, each predicted from the ones before it.

    ``predict(size)`` gives (seconds, bytes of memory or None) for one run from the last
    two sizes that completed (their growth exponent, at least 1; with ``affine``, the
    straight line through them: a start-up cost plus a cost per op), or from the last one
    alone (linear); ``skip(size)`` says why not to run a size, or None.
    """

    def __init__(
        self, timeout: float, mem_cap: float | None, deadline: float, affine: bool = False
    ) -> None:
        self.affine = affine
        self.timeout = timeout
        self.mem_cap = mem_cap
        self.deadline = deadline  # time.monotonic() by which the suite should be done
        self.done: list[tuple[int, float, float | None]] = []  # size, median s, peak bytes
        self.stopped: str | None = None

    def record(self, attempt: Attempt, mem: float | None = None) -> None:
        if attempt.ok:
            self.done.append((attempt.size, statistics.median(attempt.times), mem))
        elif attempt.timed_out is not None:
            self.stopped = f"not run: {power(attempt.size)} timed out"
        elif attempt.failures:
            self.stopped = f"not run: {power(attempt.size)} failed"

    def _grow(self, points: list[tuple[int, float]], size: int) -> float:
        if len(points) >= 2 and points[-1][1] > 0 and points[-2][1] > 0:
            (n1, v1), (n2, v2) = points[-2], points[-1]
            if self.affine and v2 > v1:  # a fixed start-up cost plus a cost per op
                return v2 + (v2 - v1) / (n2 - n1) * (size - n2)
            k = max(1.0, math.log(v2 / v1) / math.log(n2 / n1))
        else:
            k = 1.0
        n, v = points[-1]
        return float(v * (size / n) ** k)

    def predict(self, size: int) -> tuple[float, float | None] | None:
        if not self.done:
            return None
        secs = self._grow([(n, t) for n, t, _ in self.done], size)
        mems = [(n, m) for n, _, m in self.done if m is not None]
        return secs, (self._grow(mems, size) if mems else None)

    def skip(self, size: int) -> str | None:
        if self.stopped:
            return self.stopped
        guess = self.predict(size)
        if guess is None:
            return None
        secs, mem = guess
        if secs > self.timeout:
            return f"not run: predicted {secs:,.0f} s per run > the {self.timeout:.0f} s cap"
        left = self.deadline - time.monotonic()
        if secs * RUNS_LONG > left:
            return (
                f"not run: predicted {RUNS_LONG} x {secs:,.1f} s, over the suite's time budget "
                f"({max(left, 0):,.0f} s left; --budget-min)"
            )
        if mem is not None and self.mem_cap is not None and mem > self.mem_cap:
            return (
                f"not run: predicted peak RSS {mem / 2**30:,.1f} GiB > the "
                f"{self.mem_cap / 2**30:g} GiB cap"
            )
        return None

    def runs(self, quick: bool, last: bool, forced: int | None, first_s: float | None) -> int:
        """Runs to take at a size: before its first run (``first_s`` None) and after it."""
        if forced:
            return forced
        if quick:
            return 1 if last else 3
        return RUNS_LONG if first_s is not None and first_s > LONG_RUN_S else RUNS


def _is_last(sizes: tuple[int, ...], size: int) -> bool:
    return size == sizes[-1]


# -- children with a hard timeout ------------------------------------------------------------


@dataclass
class Child:
    code: int | None  # None: killed at the timeout
    wall: float
    maxrss: int  # bytes, the child's own peak (wait4)
    killed_at: float | None  # time.time() of the kill
    cpu: float = 0.0  # the child's user + system seconds (wait4)


def run_child(
    command: list[str],
    timeout: float,
    out: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    mem_cap: float | None = None,
) -> Child:
    """Run ``command`` in a session of its own, stdout+stderr to ``out``; kill its group
    at ``timeout``.  Its peak RSS comes from ``wait4`` on it (not RUSAGE_CHILDREN, which
    keeps the maximum over every child so far)."""

    def limit() -> None:
        if mem_cap is not None:
            cap = int(mem_cap)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    started = time.monotonic()
    with out.open("wb") as log:
        proc = start_logged(
            command, log, env, cwd=cwd, preexec_fn=limit if mem_cap is not None else None
        )
    killed_at = None
    status, usage = 0, None
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - started > timeout:
                killed_at = time.time()
                kill_group(proc.pid)
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
    finally:
        proc.returncode = 0  # reaped here; keep Popen from waiting on it again
        kill_group(proc.pid)  # anything it left in its session
    wall = time.monotonic() - started
    code = os.waitstatus_to_exitcode(status) if killed_at is None else None
    maxrss = usage.ru_maxrss * 1024 if usage is not None else 0
    cpu = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
    return Child(code, wall, maxrss, killed_at, cpu)


# -- part 1: verdict latency after history ---------------------------------------------------


def _culprit_line(path: Path) -> int:
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if "# dl2: culprit" in line:
            return number
    raise SystemExit(f"{path}: no '# dl2: culprit' line")


def _kill_ranks(log: str) -> None:
    """The ranks run in sessions of their own: kill any still running (each printed its
    pid first; only a process still running the history script is killed)."""
    for _, pid_text in PID.findall(log):
        pid = int(pid_text)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if HISTORY_SCRIPT.name.encode() in cmdline:
            try:
                os.kill(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass


def _json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def check_report(
    report: dict[str, Any], file_name: str, cycle_line: int, other_line: int | None
) -> str | None:
    """None if ``report`` (dl2's JSON report) gives a deadlock whose cycle is ranks 0 and
    1, both at ``file_name:cycle_line``, and (when it lists them) every other rank at
    ``other_line``; else what is wrong."""
    if report.get("verdict") != "deadlock":
        return f"verdict {report.get('verdict')!r}"
    findings = [f for f in report.get("findings", []) if f.get("kind") == "deadlock"]
    if not findings:
        return "no deadlock finding"
    finding = findings[0]
    cycle = finding.get("cycle", finding.get("ranks"))
    if sorted(cycle or []) != [0, 1]:
        return f"deadlock cycle {cycle}, expected [0, 1]"
    sites = {
        (op.get("rank"), Path(str(op.get("file"))).name, op.get("line"))
        for op in finding.get("ops", [])
    }
    for rank in (0, 1):
        if (rank, file_name, cycle_line) not in sites:
            return f"the cycle's ops do not put rank {rank} at {file_name}:{cycle_line}: {sites}"
    if other_line is not None:
        for entry in report.get("ranks", []):
            rank, op = entry.get("rank"), entry.get("op") or {}
            if rank not in (0, 1) and op.get("line") != other_line:
                return f"rank {rank} reported at line {op.get('line')}, expected {other_line}"
    return None


def history_run(n: int, work: Path, index: int, timeout: float) -> tuple[dict[str, Any], str]:
    """One ``dl2 run -n 2 history_sendsend.py N``: (figures, failure or "")."""
    run_dir = work / f"hist-{n}-{index}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = ["run", "--run-dir", str(run_dir), "--hang-timeout", "100000", "-n", "2"]
    args += [HISTORY_SCRIPT.name, str(n)]
    log_path = work / f"hist-{n}-{index}.log"
    child = run_child([str(DL2), *args], timeout, log_path, cwd=CASES, env=env)
    log = log_path.read_text(errors="replace")
    _kill_ranks(log)
    stamps = {int(r): float(t) for r, t in BLOCK.findall(log)}
    pids = {int(r): int(p) for r, p in PID.findall(log)}
    phases = [float(s) for _, _, s in HISTORY.findall(log)]
    figures: dict[str, Any] = {"n": n, "job_wall_s": child.wall, "exit": child.code}
    if phases:
        figures["history_s"] = max(phases)
    if 0 in pids:
        # every segment of rank 0's process (a long trace rotates: .s000001 and on)
        stem = stream_of(trace_file_name(0, pids[0]))[0]
        segments = [p for p in run_dir.glob(f"*{TRACE_SUFFIX}") if stream_of(p.name)[0] == stem]
        if segments:
            figures["trace_bytes_rank0"] = sum(p.stat().st_size for p in segments)
    if child.code is None:
        figures["timed_out_s"] = timeout
        if len(stamps) == 2 and child.killed_at is not None:
            figures["latency_over_s"] = child.killed_at - max(stamps.values())
        shutil.rmtree(run_dir, ignore_errors=True)
        return figures, ""
    meta = _json_file(run_dir / "run.json")
    wall = meta.get("verdict_wall_time")
    problem = ""
    if child.code != 3 or meta.get("reason") != "deadlock" or not isinstance(wall, float):
        problem = f"exit {child.code}, reason {meta.get('reason')!r}"
    elif sorted(stamps) != [0, 1]:
        problem = f"block stamps of ranks {sorted(stamps)}"
    else:
        wrong = check_report(
            _json_file(run_dir / "report.json"),
            HISTORY_SCRIPT.name,
            _culprit_line(HISTORY_SCRIPT),
            None,
        )
        if wrong:
            problem = wrong
        else:
            figures["latency_s"] = wall - max(stamps.values())
            figures["detected_after_s"] = meta.get("detected_after")
    if problem:
        figures["log_tail"] = log[-400:]
    shutil.rmtree(run_dir, ignore_errors=True)
    return figures, problem


def history(work: Path, opts: Options) -> dict[str, Any]:
    sizes = opts.history_sizes
    sweep = Sweep(opts.history_timeout, None, opts.deadline, affine=True)
    attempts: list[Attempt] = []
    rows: list[dict[str, Any]] = []
    for n in sizes:
        attempt = Attempt(n)
        attempts.append(attempt)
        reason = sweep.skip(n)
        if reason is not None and n not in opts.forced_history:
            attempt.not_run = reason
            print(f"  N={power(n)}: {reason}", flush=True)
            continue
        runs = sweep.runs(opts.quick, _is_last(sizes, n), opts.runs, None)
        index = 0
        while index < runs:
            index += 1
            figures, problem = history_run(n, work, index, opts.history_timeout)
            if index == 1:
                runs = sweep.runs(opts.quick, _is_last(sizes, n), opts.runs, figures["job_wall_s"])
            rows.append(figures)
            if problem:
                attempt.failures.append(problem)
                print(f"  N={power(n)} run {index}: FAILED: {problem}", flush=True)
                break
            if "timed_out_s" in figures:
                attempt.timed_out = opts.history_timeout
                over = figures.get("latency_over_s")
                attempt.info["latency_over_s"] = over
                what = (
                    f"no verdict {over:.1f} s after the block"
                    if over is not None
                    else "the history did not finish"
                )
                print(f"  N={power(n)} run {index}: timed out ({what})", flush=True)
                break
            attempt.times.append(figures["latency_s"])
            attempt.add("job_wall_s", figures["job_wall_s"])
            if "history_s" in figures:
                attempt.add("history_s", figures["history_s"])
            if "trace_bytes_rank0" in figures:
                attempt.add("bytes_per_op", figures["trace_bytes_rank0"] / n)
                attempt.info["trace_bytes_rank0"] = figures["trace_bytes_rank0"]
            print(
                f"  N={power(n)} run {index}/{runs}: latency {figures['latency_s']:.2f} s, "
                f"job {figures['job_wall_s']:.1f} s",
                flush=True,
            )
        # the sweep predicts a whole run (the job) from the sizes before
        walls = attempt.extra.get("job_wall_s", [])
        proxy = Attempt(n, times=walls, failures=attempt.failures, timed_out=attempt.timed_out)
        sweep.record(proxy)
    return {"attempts": [asdict(a) for a in attempts], "runs": rows}


def history_table(result: dict[str, Any]) -> str:
    rows = []
    for a in result["attempts"]:
        n = a["size"]
        if a["not_run"]:
            rows.append([power(n), "0", a["not_run"], "-", "-", "-"])
            continue
        extra = a["extra"]
        if a["failures"]:
            latency = "**FAILED**: " + a["failures"][0]
        elif a["timed_out"] is not None:
            over = a["info"].get("latency_over_s")
            latency = (
                f"> {over:.0f} s (timed out: job capped at {a['timed_out']:.0f} s)"
                if over is not None
                else f"timed out: the history did not finish in {a['timed_out']:.0f} s"
            )
        else:
            latency = spread(a["times"])
        runs = len(a["times"]) or 1
        rows.append(
            [
                power(n),
                str(runs),
                latency,
                spread(extra.get("job_wall_s", []), "{:.1f}"),
                spread(extra.get("history_s", []), "{:.1f}"),
                spread(extra.get("bytes_per_op", []), "{:.0f}", " B"),
            ]
        )
    header = ["N ops", "runs", "verdict latency", "job wall", "history phase", "trace B/op"]
    return markdown_table(header, rows)


# -- part 2: offline analysis throughput -----------------------------------------------------


def analyze_run(run: scale_traces.RunDir, work: Path, index: int, opts: Options) -> Child:
    json_path = work / f"report-{index}.json"
    json_path.unlink(missing_ok=True)
    command = [str(DL2), "analyze", str(run.path), "--json", str(json_path)]
    return run_child(
        command, opts.analyze_timeout, work / "analyze.log", mem_cap=opts.mem_cap_gib * 2**30
    )


def check_split(report: dict[str, Any], world: int) -> str | None:
    """None if ``report`` gives a deadlock whose cycle is rank 0 (at the generated
    all_reduce line) and rank W/2 (at the barrier line); else what is wrong."""
    if report.get("verdict") != "deadlock":
        return f"verdict {report.get('verdict')!r}"
    findings = [f for f in report.get("findings", []) if f.get("kind") == "deadlock"]
    if not findings:
        return "no deadlock finding"
    cycle = findings[0].get("cycle", findings[0].get("ranks"))
    if list(cycle or []) != [0, world // 2]:
        return f"deadlock cycle {cycle}, expected [0, {world // 2}]"
    sites = {(op.get("rank"), op.get("line")) for op in findings[0].get("ops", [])}
    expected = {(0, scale_traces.REDUCE_LINE), (world // 2, scale_traces.BARRIER_LINE)}
    if not expected <= sites:
        return f"the cycle's ops are at {sorted(sites)}, expected {sorted(expected)}"
    return None


def offline_sweep(
    label: str,
    shapes: list[tuple[int, int, int]],  # (size, world, ops)
    work: Path,
    opts: Options,
    ending: str = "cycle",
) -> list[Attempt]:
    sweep = Sweep(opts.analyze_timeout, opts.mem_cap_gib * 2**30, opts.deadline)
    sizes = tuple(s for s, _, _ in shapes)
    attempts = []
    for size, world, ops in shapes:
        attempt = Attempt(size)
        attempt.info.update(
            world=world, ops=ops, records=scale_traces.record_count(world, ops), bytes=None
        )
        attempts.append(attempt)
        tag = f"{label} {world} ranks x {power(ops)} ops"
        reason = sweep.skip(size)
        if reason is not None:
            attempt.not_run = reason
            print(f"  {tag}: {reason}", flush=True)
            continue
        run_dir = work / f"{label}-{world}x{ops}"
        started = time.monotonic()
        try:
            generated = scale_traces.write_run_dir(run_dir, world, ops, ending)
        except Exception as err:  # the generator is out of step with the encoder
            attempt.failures.append(f"generator: {err!r}")
            print(f"  {tag}: generator FAILED: {err!r}", flush=True)
            sweep.record(attempt)
            continue
        attempt.info.update(
            world=world,
            ops=ops,
            records=generated.records,
            bytes=generated.bytes,
            generate_s=time.monotonic() - started,
        )
        runs = sweep.runs(opts.quick, _is_last(sizes, size), opts.runs, None)
        peak = 0
        index = 0
        while index < runs:
            index += 1
            child = analyze_run(generated, work, index, opts)
            if index == 1:
                runs = sweep.runs(opts.quick, _is_last(sizes, size), opts.runs, child.wall)
            peak = max(peak, child.maxrss)
            if child.code is None:
                attempt.timed_out = opts.analyze_timeout
                attempt.add("peak_rss", child.maxrss)
                print(f"  {tag}: run {index} timed out at {child.wall:.0f} s", flush=True)
                break
            output = (work / "analyze.log").read_text(errors="replace")
            wrong: str | None
            if "MemoryError" in output:
                wrong = f"out of memory (MemoryError under the {opts.mem_cap_gib:g} GiB cap)"
            elif child.code != 3:
                wrong = f"exit {child.code}"
            elif ending == "split":
                wrong = check_split(_json_file(work / f"report-{index}.json"), world)
            else:
                wrong = check_report(
                    _json_file(work / f"report-{index}.json"),
                    Path(scale_traces.FILE).name,
                    scale_traces.SEND_LINE,
                    scale_traces.BARRIER_LINE,
                )
            if wrong:
                tail = output[-300:]
                attempt.failures.append(f"{wrong}; {tail!r}")
                print(f"  {tag}: run {index} FAILED: {wrong}", flush=True)
                break
            attempt.times.append(child.wall)
            attempt.add("records_per_s", generated.records / child.wall)
            attempt.add("cpu_s", child.cpu)
            attempt.add("records_per_cpu_s", generated.records / max(child.cpu, 1e-9))
            attempt.add("peak_rss", child.maxrss)
            print(
                f"  {tag}: run {index}/{runs}: {child.wall:.2f} s ({child.cpu:.2f} s CPU), "
                f"{generated.records / child.wall:,.0f} records/s, peak RSS {mib(child.maxrss)}",
                flush=True,
            )
        sweep.record(attempt, float(peak) if attempt.ok else None)
        shutil.rmtree(run_dir, ignore_errors=True)
    return attempts


def offline(work: Path, opts: Options) -> dict[str, Any]:
    print(f"-- (a) {OPS_WORLD} ranks x N ops", flush=True)
    ops = offline_sweep("ops", [(n, OPS_WORLD, n) for n in opts.ops_sizes], work, opts)
    print(f"-- (b) R ranks x {RANK_OPS} ops", flush=True)
    ranks = offline_sweep("ranks", [(r, r, RANK_OPS) for r in opts.rank_sizes], work, opts)
    print(f"-- (c) R ranks x {SPLIT_OPS} ops, split in halves", flush=True)
    split = offline_sweep(
        "split", [(r, r, SPLIT_OPS) for r in opts.split_sizes], work, opts, ending="split"
    )
    return {
        "ops": [asdict(a) for a in ops],
        "ranks": [asdict(a) for a in ranks],
        "split": [asdict(a) for a in split],
    }


def _per_cpu(extra: dict[str, Any]) -> str:
    """Records per CPU second of the runs (a loaded machine stretches wall times)."""
    rates = extra.get("records_per_cpu_s")
    if not rates:
        return "-"
    return f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"


def offline_table(attempts: list[dict[str, Any]], cap_s: float) -> str:
    rows = []
    for a in attempts:
        info, extra = a["info"], a["extra"]
        shape = f"{info['world']:,} x {power(info['ops'])}"
        records = f"{info['records']:,}"
        size = mib(info["bytes"]) if info.get("bytes") else "-"
        if a["not_run"]:
            rows.append([shape, records, size, "0", a["not_run"], "-", "-", "-", "-"])
            continue
        if a["failures"]:
            rows.append(
                [shape, records, size, "1", "**FAILED**: " + a["failures"][0][:160]] + ["-"] * 4
            )
            continue
        if a["timed_out"] is not None:
            rss = extra.get("peak_rss", [0])
            rows.append(
                [
                    shape,
                    records,
                    size,
                    "1",
                    f"> {a['timed_out']:.0f} s (timed out)",
                    f"< {info['records'] / a['timed_out']:,.0f}",
                    "-",
                    f"≥ {mib(max(rss))}",
                    "-",
                ]
            )
            continue
        rss = extra.get("peak_rss", [])
        rows.append(
            [
                shape,
                records,
                size,
                str(len(a["times"])),
                spread(a["times"]),
                f"{statistics.median(extra['records_per_s']):,.0f}",
                _per_cpu(extra),
                f"{mib(statistics.median(rss))} (max {mib(max(rss))})",
                "ok",
            ]
        )
    header = [
        "ranks x ops",
        "records",
        "on disk",
        "runs",
        "dl2 analyze wall",
        "records/s (median)",
        "records/CPU s (median, min-max)",
        "peak RSS (median)",
        "verdict",
    ]
    return markdown_table(header, rows) + f"\n\n(cap per run: {cap_s:.0f} s)"


def growth_table(result: dict[str, Any]) -> str:
    """Time at 1x, 2x, 4x, ... the base size of each sweep, as ratios."""
    rows = []
    for label, key, unit in (
        (f"history ({OPS_WORLD} ranks x N ops)", "ops", "ops"),
        (f"ranks (R x {RANK_OPS} ops)", "ranks", "ranks"),
        (f"split world (R x {SPLIT_OPS} ops, halves waiting on each other)", "split", "ranks"),
    ):
        measured = [a for a in result.get(key, []) if a["times"] and not a["failures"]]
        if not measured:
            continue
        base = measured[0]
        t0 = statistics.median(base["times"])
        for a in result[key]:
            if a["size"] < base["size"]:
                continue
            m = a["size"] / base["size"]
            size = f"{m:g}x ({a['size']:,} {unit})"
            if a is base:
                rows.append([label, size, f"{t0:.2f} s", "1.00", "-"])
            elif a["not_run"]:
                rows.append([label, size, a["not_run"], "-", "-"])
            elif a["failures"]:
                rows.append([label, size, "FAILED", "-", "-"])
            else:
                timed_out = a["timed_out"] is not None
                t = a["timed_out"] if timed_out else statistics.median(a["times"])
                lower = "> " if timed_out else ""
                k = math.log(t / t0) / math.log(m)
                rows.append(
                    [label, size, f"{lower}{t:.2f} s", f"{lower}{t / t0:.2f}", f"{lower}{k:.2f}"]
                )
    header = ["sweep", "size", "analyze wall (median)", "time ratio", "exponent k (t ∝ size^k)"]
    return markdown_table(header, rows)


# -- part 3: disk after 10^6 ops -------------------------------------------------------------


def disk(work: Path, opts: Options, history_result: dict[str, Any] | None) -> dict[str, Any]:
    """One rank recorded by dl2 with the default retention, 10^6 blocking all_reduce
    (``benchmarks/trace_size.py``: gloo replaced by an already complete work)."""
    from benchmarks import trace_size

    out: dict[str, Any] = {"ops": DISK_OPS}
    started = time.monotonic()
    measured = trace_size.measure(DISK_OPS)
    if measured is None:
        print("  disk: FAILED", flush=True)
        return out
    big = measured["big"]
    out["recorded"] = {
        "disk_bytes": big["disk"],
        "written_bytes": big["written"],
        "segments_kept": len(big["files"]),
        "segment_bytes": big["segment_bytes"],
        "keep": big["keep"],
        "bytes_per_op": measured["blocking"],
        "s": time.monotonic() - started,
    }
    print(f"  recorded: {big['disk']:,} B on disk after {DISK_OPS:,} ops", flush=True)
    if history_result:
        done = [
            a
            for a in history_result["attempts"]
            if a["extra"].get("bytes_per_op") and not a["failures"]
        ]
        if done:
            largest = done[-1]
            out["history_job"] = {
                "n": largest["size"],
                "bytes_rank0": largest["info"].get("trace_bytes_rank0"),
                "bytes_per_op": statistics.median(largest["extra"]["bytes_per_op"]),
            }
    return out


def disk_table(result: dict[str, Any]) -> str:
    rows = []
    rec = result.get("recorded")
    if rec:
        rows.append(
            [
                f"one rank recorded by dl2, {power(result['ops'])} blocking all_reduces, "
                f"default retention (keep {rec['keep']} x {mib(rec['segment_bytes'])})",
                f"{rec['disk_bytes']:,} B = {mib(rec['disk_bytes'])} on disk in "
                f"{rec['segments_kept']} segment(s); {mib(rec['written_bytes'])} written",
                f"{rec['bytes_per_op']:.1f}",
            ]
        )
    job = result.get("history_job")
    if job:
        rows.append(
            [
                f"history job's real trace at N = {power(job['n'])} (rank 0: "
                f"{job['bytes_rank0']:,} B)",
                "-",
                f"{job['bytes_per_op']:.1f}",
            ]
        )
    return markdown_table(["source", "disk", "B/op"], rows)


# -- the suite -------------------------------------------------------------------------------


@dataclass
class Options:
    quick: bool
    parts: list[str]
    runs: int | None
    history_sizes: tuple[int, ...]
    forced_history: tuple[int, ...]
    ops_sizes: tuple[int, ...]
    rank_sizes: tuple[int, ...]
    split_sizes: tuple[int, ...]
    history_timeout: float
    analyze_timeout: float
    mem_cap_gib: float
    docs: bool
    render_last: bool
    budget_min: float
    deadline: float = 0.0  # set when the suite starts


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(float(v)) for v in text.split(",") if v)


def parse(argv: list[str]) -> Options | str:
    quick = "--quick" in argv
    values: dict[str, str] = {}
    for arg in argv:
        if arg in ("--quick", "--docs", "--render-last"):
            continue
        key, sep, value = arg.partition("=")
        if not sep or key not in (
            "--only",
            "--runs",
            "--history-sizes",
            "--ops-sizes",
            "--rank-sizes",
            "--split-sizes",
            "--history-timeout",
            "--analyze-timeout",
            "--mem-cap-gib",
            "--budget-min",
        ):
            return f"unknown option {arg!r}"
        values[key] = value
    parts = [p for p in values.get("--only", ",".join(PARTS)).split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        return f"unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}"
    forced = _ints(values.get("--history-sizes", ""))
    return Options(
        quick=quick,
        parts=parts,
        runs=int(values["--runs"]) if "--runs" in values else None,
        history_sizes=forced or (HISTORY_SIZES_QUICK if quick else HISTORY_SIZES),
        forced_history=forced,
        ops_sizes=_ints(values.get("--ops-sizes", "")) or (OPS_SIZES_QUICK if quick else OPS_SIZES),
        rank_sizes=_ints(values.get("--rank-sizes", ""))
        or (RANK_SIZES_QUICK if quick else RANK_SIZES),
        split_sizes=_ints(values.get("--split-sizes", ""))
        or (SPLIT_SIZES_QUICK if quick else SPLIT_SIZES),
        history_timeout=float(
            values.get("--history-timeout", HISTORY_TIMEOUT_QUICK_S if quick else HISTORY_TIMEOUT_S)
        ),
        analyze_timeout=float(
            values.get("--analyze-timeout", ANALYZE_TIMEOUT_QUICK_S if quick else ANALYZE_TIMEOUT_S)
        ),
        mem_cap_gib=float(values.get("--mem-cap-gib", MEM_CAP_GIB)),
        docs="--docs" in argv,
        render_last="--render-last" in argv,
        budget_min=float(values.get("--budget-min", BUDGET_MIN_QUICK if quick else BUDGET_MIN)),
    )


PARTS: dict[str, Callable[..., Any]] = {"history": history, "offline": offline, "disk": disk}


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _load(results: dict[str, Any]) -> str:
    start, end = results.get("load_avg_start"), results.get("load_avg_end")
    if start is None or end is None:
        return ""
    return f", load average {start:.1f} at the start, {end:.1f} at the end"


def render(results: dict[str, Any]) -> str:
    """The markdown of a run: command, machine, one table per part."""
    out = [
        f"Command: `{results['command']}` ({results['wall_s'] / 60:.1f} min on this machine, "
        f"{os.cpu_count()} cores{_load(results)}, {results['date']}, commit "
        f"{results['commit'] or '?'}; times are median (min–max) of the runs).",
    ]
    if "history" in results:
        out += [
            "",
            "**Verdict latency after a history** (`scale_cases/history_sendsend.py N` under "
            "`dl2 run -n 2`; latency = run.json `verdict_wall_time` − the later `DL2-BLOCK` "
            "stamp; history phase = the N all_reduces; trace B/op = rank 0's trace / N):",
            "",
            history_table(results["history"]),
        ]
        if any(a["not_run"] for a in results["history"]["attempts"]):
            out += [
                "",
                "A size not run is run anyway with `--history-sizes=N --history-timeout=S`.",
            ]
    if "offline" in results:
        cap = results["options"]["analyze_timeout"]
        out += [
            "",
            f"**Offline analysis, (a) {OPS_WORLD} ranks x N ops** (`dl2 analyze --json` on "
            "synthetic traces; every verdict checked: exit 3, cycle 0 ⇄ 1 at the generated "
            f"send line, the other ranks at the barrier line; memory cap "
            f"{results['options']['mem_cap_gib']:g} GiB):",
            "",
            offline_table(results["offline"]["ops"], cap),
            "",
            f"**Offline analysis, (b) R ranks x {RANK_OPS} ops**:",
            "",
            offline_table(results["offline"]["ranks"], cap),
            "",
            *(
                [
                    f"**Offline analysis, (c) R ranks x {SPLIT_OPS} ops, split in halves** "
                    "(cycle 0 ⇄ W/2 checked):",
                    "",
                    offline_table(results["offline"]["split"], cap),
                    "",
                ]
                if results["offline"].get("split")
                else []
            ),
            "**Growth** (analyze wall time at 1x, 2x, 4x ... the first size; exponent k = "
            "log(time ratio) / log(size ratio): 1 is linear, 2 quadratic):",
            "",
            growth_table(results["offline"]),
        ]
    if "disk" in results:
        out += [
            "",
            f"**Disk after {power(DISK_OPS)} ops** (default settings, one rank):",
            "",
            disk_table(results["disk"]),
        ]
    return "\n".join(out)


def write_docs(markdown: str) -> bool:
    text = DOCS.read_text()
    start, end = text.find(DOCS_START), text.find(DOCS_END)
    if start < 0 or end < start:
        print(f"scale: {DOCS.relative_to(REPO)} has no {DOCS_START} ... {DOCS_END} block")
        return False
    DOCS.write_text(text[: start + len(DOCS_START)] + "\n" + markdown + "\n" + text[end:])
    return True


def render_last(docs: bool) -> int:
    """Print (and with ``docs`` write) the tables of the last full run in scale.jsonl
    (or of the last run, if none was full)."""
    try:
        runs = [json.loads(line) for line in RESULTS.read_text().splitlines() if line]
    except (OSError, ValueError):
        runs = []
    if not runs:
        print(f"scale: no run in {RESULTS.relative_to(REPO)}")
        return 2
    full = [r for r in runs if not r.get("quick")]
    markdown = render((full or runs)[-1])
    print(markdown)
    if docs and write_docs(markdown):
        print(f"scale: rewrote the scale section of {DOCS.relative_to(REPO)}")
    return 0


def main(argv: list[str]) -> int:
    opts = parse(argv)
    if isinstance(opts, str):
        print(f"scale: {opts}")
        return 2
    if not DL2.exists():
        print(f"scale: {DL2} not found (make install)")
        return 2
    if opts.render_last:
        return render_last(opts.docs)
    command = "OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks scale " + " ".join(argv)
    # dl2's bytecode, as an installed package has it (pip compiles it): with
    # PYTHONDONTWRITEBYTECODE set (as on this machine) every run compiled dl2 afresh
    compileall.compile_dir(str(REPO / "src" / "dl2"), quiet=1)
    started = time.monotonic()
    opts.deadline = started + opts.budget_min * 60
    results: dict[str, Any] = {
        "suite": "scale",
        "command": command.strip(),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "commit": _commit(),
        "quick": opts.quick,
        "python": str(PYTHON),
        "options": asdict(opts),
        "load_avg_start": os.getloadavg()[0],
    }
    status = 0
    with tempfile.TemporaryDirectory(prefix="dl2-scale-") as tmp:
        work = Path(tmp)
        for name in opts.parts:
            print(f"-- {name}", flush=True)
            t0 = time.monotonic()
            if name == "disk":
                results[name] = disk(work, opts, results.get("history"))
            else:
                results[name] = PARTS[name](work, opts)
            print(f"   ({time.monotonic() - t0:.0f} s)", flush=True)
    results["wall_s"] = time.monotonic() - started
    results["load_avg_end"] = os.getloadavg()[0]
    for part in ("history",):
        if any(a["failures"] for a in results.get(part, {}).get("attempts", [])):
            status = 1
    for key in ("ops", "ranks", "split"):
        if any(a["failures"] for a in results.get("offline", {}).get(key, [])):
            status = 1
    markdown = render(results)
    print()
    print(markdown, flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as handle:
        handle.write(json.dumps(results, default=str, sort_keys=True) + "\n")
    print(f"\nscale: appended this run to {RESULTS.relative_to(REPO)}")
    if opts.docs and write_docs(markdown):
        print(f"scale: rewrote the scale section of {DOCS.relative_to(REPO)}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
