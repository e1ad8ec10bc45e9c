"""Online detection, measured: verdict latency, false alarms, and what the monitor costs.

Run ``python -m benchmarks online [--quick] [--only=latency,false-alarms,cost]``
(``OMP_NUM_THREADS=1``; every ``dl2 run`` has a hard timeout and is killed with all it
started past it; ``DL2_ONLINE_RESULTS=FILE`` also writes the figures as JSON).
Three figures, each on jobs of ``benchmarks/online_cases``:

* **verdict latency**: each deadlocking case (``dl_*.py``, 7 categories) stamps
  ``time.time()`` just before each rank's blocking call; the latency of a run is the
  monitor's ``verdict_wall_time`` (run.json) minus the latest stamp of a member of the
  deadlock.  Runs one at a time, 2 seeds per case (``--quick``: 1).
* **false alarms**: ``ok_random.py`` (a correct 2-rank job with random 0-3 s per-rank
  delays before its collectives and P2P ops, slow ranks and compute phases) with 30
  seeds (``--quick``: 20), ``--suspect-after 1``, 4 runs at a time; counts deadlock
  verdicts (exit 3 or run.json reason "deadlock") and any other non-zero exit.
* **monitor cost**: ``ddp_steps.py`` (a small DDP loop, 2 ranks) under ``dl2 run``; the
  benchmark freezes and thaws the monitor (SIGSTOP/SIGCONT on the dl2 process, which
  only watches; the ranks are separate processes) in alternating 1 s phases of the same
  run, and compares the median step time of steps that ran entirely with the monitor
  running against those with it frozen.  Recording is on in both.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from benchmarks._harness import BENCH
from benchmarks._harness import DL2
from benchmarks._harness import kill_group
from benchmarks._harness import start_logged

CASES = BENCH / "online_cases"

RUN_TIMEOUT_S = 90
LATENCY_SEEDS, LATENCY_SEEDS_QUICK = 2, 1
FALSE_ALARM_RUNS, FALSE_ALARM_RUNS_QUICK = 30, 20
FALSE_ALARM_PARALLEL = 4
COST_SECONDS, COST_SECONDS_QUICK = 25.0, 12.0
COST_PHASE_S = 1.0

BLOCK = re.compile(r"DL2-BLOCK rank=(\d+) t=([0-9.]+)")
HEADER = re.compile(r"^# online: world=(\d+) category=(\S+)", re.M)


@dataclass
class Result:
    code: int
    output: str
    run_dir: Path
    wall: float

    def meta(self) -> dict[str, object]:
        try:
            data = json.loads((self.run_dir / "run.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


def dl2_run(args: list[str], run_dir: Path, seed: int, timeout: float = RUN_TIMEOUT_S) -> Result:
    """``dl2 run --run-dir RUN_DIR ARGS`` with a hard timeout (the process group is killed)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DL2_BENCH_SEED=str(seed))
    log = run_dir.with_suffix(".log")
    started = time.monotonic()
    with log.open("wb") as out:
        proc = start_logged([str(DL2), "run", "--run-dir", str(run_dir), *args], out, env, CASES)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = -999
        finally:
            kill_group(proc.pid)
            proc.wait()
    return Result(code, log.read_text(errors="replace"), run_dir, time.monotonic() - started)


def _rank_pids(run_dir: Path) -> list[int]:
    pids = []
    for path in run_dir.glob("*.dl2.jsonl"):
        try:
            pids.append(int(json.loads(path.open().readline())["pid"]))
        except (OSError, ValueError, KeyError):
            pass
    return pids


def _kill_ranks(run_dir: Path) -> None:
    """Ranks run in sessions of their own: kill any the run left behind."""
    for pid in _rank_pids(run_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _case_info(path: Path) -> tuple[int, str]:
    match = HEADER.search(path.read_text())
    if match is None:
        raise SystemExit(f"{path}: no '# online: world=N category=NAME' header")
    return int(match.group(1)), match.group(2)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- verdict latency -------------------------------------------------------------------------


def latency(work: Path, quick: bool) -> dict[str, object]:
    seeds = LATENCY_SEEDS_QUICK if quick else LATENCY_SEEDS
    cases = sorted(CASES.glob("dl_*.py"))
    rows: list[dict[str, object]] = []
    failures: list[str] = []
    started = time.monotonic()
    for seed in range(seeds):
        for case in cases:
            world, category = _case_info(case)
            run_dir = work / f"lat-{case.stem}-{seed}"
            args = ["--hang-timeout", "60", "-n", str(world), case.name]
            result = dl2_run(args, run_dir, seed)
            _kill_ranks(run_dir)
            meta = result.meta()
            stamps = {int(r): float(t) for r, t in BLOCK.findall(result.output)}
            members = [int(r) for r in (meta.get("deadlock_ranks") or [])] or sorted(stamps)
            wall = meta.get("verdict_wall_time")
            if (
                result.code != 3
                or meta.get("reason") != "deadlock"
                or not isinstance(wall, float)
                or not set(members) <= set(stamps)
            ):
                failures.append(f"{case.name} seed {seed}: exit {result.code}, {meta}")
                continue
            blocked = max(stamps[m] for m in members)
            rows.append(
                {
                    "case": case.stem,
                    "category": category,
                    "seed": seed,
                    "latency_s": wall - blocked,
                    "monitor_detected_after_s": meta.get("detected_after"),
                }
            )
            print(
                f"  {category:26s} seed {seed}: verdict {wall - blocked:6.3f} s after the last "
                "member blocked",
                flush=True,
            )
    values = [float(r["latency_s"]) for r in rows]  # type: ignore[arg-type]
    return {
        "runs": len(rows),
        "categories": sorted({str(r["category"]) for r in rows}),
        "median_s": statistics.median(values) if values else None,
        "p90_s": _pct(values, 0.9) if values else None,
        "max_s": max(values) if values else None,
        "failures": failures,
        "wall_s": time.monotonic() - started,
    }


# -- false alarms ----------------------------------------------------------------------------


def false_alarms(work: Path, quick: bool) -> dict[str, object]:
    runs = FALSE_ALARM_RUNS_QUICK if quick else FALSE_ALARM_RUNS
    case = CASES / "ok_random.py"
    started = time.monotonic()

    def one(seed: int) -> Result:
        run_dir = work / f"ok-{seed}"
        result = dl2_run(["--suspect-after", "1", "-n", "2", case.name], run_dir, seed)
        _kill_ranks(run_dir)
        return result

    verdicts, other, suspects, walls = [], [], 0, []
    with ThreadPoolExecutor(FALSE_ALARM_PARALLEL) as pool:
        for seed, result in enumerate(pool.map(one, range(runs))):
            meta = result.meta()
            walls.append(result.wall)
            suspects += result.output.count("hang suspect")
            if result.code == 3 or meta.get("reason") == "deadlock":
                verdicts.append(seed)
            elif result.code != 0:
                other.append(f"seed {seed}: exit {result.code}: {result.output[-300:]!r}")
            if (seed + 1) % 20 == 0:
                print(f"  {seed + 1}/{runs} runs, {len(verdicts)} deadlock verdicts", flush=True)
    return {
        "runs": runs,
        "deadlock_verdicts": len(verdicts),
        "verdict_seeds": verdicts,
        "other_failures": other,
        "hang_suspect_notices": suspects,
        "median_run_s": statistics.median(walls),
        "wall_s": time.monotonic() - started,
    }


# -- monitor cost ----------------------------------------------------------------------------


def cost(work: Path, quick: bool) -> dict[str, object]:
    seconds = COST_SECONDS_QUICK if quick else COST_SECONDS
    run_dir = work / "cost"
    prefix = work / "steps"
    log = work / "cost.log"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    toggles: list[tuple[int, bool]] = []
    job_args = [str(seconds), str(prefix)]
    with log.open("wb") as out:
        proc = start_logged(
            [str(DL2), "run", "--run-dir", str(run_dir), "-n", "2", "ddp_steps.py", *job_args],
            out,
            env,
            CASES,
        )
        running = True
        deadline = time.monotonic() + seconds + RUN_TIMEOUT_S
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(COST_PHASE_S)
                if proc.poll() is not None:
                    break
                running = not running
                os.kill(proc.pid, signal.SIGCONT if running else signal.SIGSTOP)
                toggles.append((time.monotonic_ns(), running))
        finally:
            try:
                os.kill(proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            kill_group(proc.pid)
            proc.wait()
            _kill_ranks(run_dir)
    on: list[float] = []
    off: list[float] = []
    for path in sorted(work.glob("steps.rank*.json")):
        for start, end in json.loads(path.read_text()):
            state = _state_during(toggles, start, end)
            if state is not None:
                (on if state else off).append((end - start) / 1e6)
    if not on or not off:
        return {"error": f"no classified steps (exit {proc.returncode}); see {log}"}
    return {
        "steps_monitor_on": len(on),
        "steps_monitor_off": len(off),
        "median_step_ms_on": statistics.median(on),
        "median_step_ms_off": statistics.median(off),
        "ratio": statistics.median(on) / statistics.median(off),
        "job_exit": proc.returncode,
    }


def _state_during(toggles: list[tuple[int, bool]], start: int, end: int) -> bool | None:
    """True/False if the monitor ran / was frozen for the whole step, None if it changed."""
    state = True  # running until the first toggle
    for when, new in toggles:
        if when <= start:
            state = new
        elif when < end:
            return None
        else:
            break
    return state


# -- the suite -------------------------------------------------------------------------------

PARTS = {"latency": latency, "false-alarms": false_alarms, "cost": cost}


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    only = next((a.split("=", 1)[1] for a in argv if a.startswith("--only=")), ",".join(PARTS))
    names = [n for n in only.split(",") if n]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        print(f"online: unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}")
        return 2
    if not DL2.exists():
        print(f"online: {DL2} not found (make install)")
        return 2
    command = "OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks online " + " ".join(argv)
    results: dict[str, object] = {"command": command.strip(), "quick": quick}
    status = 0
    with tempfile.TemporaryDirectory(prefix="dl2-online-") as tmp:
        for name in names:
            print(f"-- {name}", flush=True)
            started = time.monotonic()
            results[name] = outcome = PARTS[name](Path(tmp), quick)
            print(json.dumps(outcome, indent=2, default=str), flush=True)
            print(f"   ({time.monotonic() - started:.0f} s)", flush=True)
            if name == "false-alarms" and outcome.get("deadlock_verdicts"):  # type: ignore[union-attr]
                status = 1
    target = os.environ.get("DL2_ONLINE_RESULTS")
    if target:
        try:
            Path(target).write_text(json.dumps(results, indent=2, default=str))
            print(f"results in {target}")
        except OSError as err:
            print(f"online: cannot write {target}: {err.strerror}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
