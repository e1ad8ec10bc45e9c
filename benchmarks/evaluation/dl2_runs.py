"""One ``dl2 run`` of a case: its report, its timings, and what the run left behind.

``dl2 run --hang-timeout 30 --json ... -n WORLD case.py`` under a hard timeout; the
report is scored against the case's header by :mod:`benchmarks.evaluation.scoring`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks._harness import DL2
from benchmarks._harness import Case
from benchmarks._harness import kill_group
from benchmarks._harness import start_logged
from benchmarks.evaluation.results import Dl2Result
from benchmarks.evaluation.scoring import score_report

#: ``dl2 run --hang-timeout``: a job with no progress this long is stopped and analysed
HANG_TIMEOUT_S = 30
#: hard limit of one ``dl2 run`` (process group killed past it)
RUN_TIMEOUT_S = 90


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
        # a case run under an emulated eager buffer (header field ``buffer``)
        *(["--buffer-size", case.fields["buffer"]] if "buffer" in case.fields else []),
        "-n",
        str(case.world),
        str(case.path),
    ]
    note = ""
    start = time.monotonic()
    # a case that hangs outside dl2's reach (header field ``interrupt``) is stopped as a
    # user at the terminal would: SIGINT to dl2 that many seconds in, its report scored
    interrupt = float(case.fields["interrupt"]) if "interrupt" in case.fields else None
    interrupted_at: float | None = None
    with out_path.open("wb") as out:
        proc = start_logged(cmd, out, env, workdir)
        try:
            code: int | None = None
            if interrupt is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = proc.wait(timeout=interrupt)
                if code is None:
                    proc.send_signal(signal.SIGINT)
                    interrupted_at = time.monotonic()
            if code is None:
                code = proc.wait(timeout=RUN_TIMEOUT_S)
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
    if interrupted_at is not None and code is not None:
        latency = end_ns / 1e9 - interrupted_at  # from the user's Ctrl-C to the verdict
    return Dl2Result(
        case=case.name,
        suite=case.suite,
        category=case.category,
        label=case.label,
        nondeterministic=case.nondeterministic,
        exit_code=code,
        wall_s=round(wall, 2),
        latency_s=None if latency is None else round(latency, 2),
        last_record_to_exit_s=None if to_exit is None else round(to_exit, 2),
        detected_after_s=detected_after if isinstance(detected_after, (int, float)) else None,
        reason=meta.get("reason"),
        note=note,
        job_exit_code=meta.get("job_exit_code"),
        **score_report(case, report),
    )


def run_cases(cases: list[Case], workdir: Path, jobs: int) -> list[Dl2Result]:
    """:func:`run_dl2` on every case, ``jobs`` at a time, printing a line for each."""

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

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, cases))
