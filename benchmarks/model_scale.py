"""The model at scale: post-mortem records/s and peak memory, and the live verdict after a
long history.

Run ``python -m benchmarks model [--quick] [--only=history,world,live,run]
[--history=N,...] [--world=W,...] [--live=N,...] [--run=N,...]`` (``OMP_NUM_THREADS=1``;
each part runs its sizes, by default three; ``--quick``: the first only).  Every trace
is synthetic, written with the test builders (``tests/trace_builders.py``) and flushed to
disk as it grows:

* **history**: 8 ranks, each issuing N healthy blocking ``all_reduce`` calls (op, ret,
  wait, ret: 4 records each), then a send/send ring deadlock (N: 25k, 50k, 100k).
* **world**: W ranks of 100 ``all_reduce`` calls each, then the same ring deadlock over
  all W ranks (its cycle is W ranks long; W: 512, 1024, 2048).
* **live**: the monitor (:class:`dl2.live.monitor.Monitor`, driven poll by poll on a fake
  job, as in ``tests/unit/test_live.py``) first reads 2 ranks' history of N all_reduce
  calls, then both ranks block in a send to each other: the figure is the wall time
  from that last append to the proven verdict, and the CPU time of those polls.
* **run**: a real job, ``dl2 run -n 2 online_cases/long_send_send.py`` with N healthy
  ``all_reduce`` calls before its send/send deadlock: the verdict latency as the online
  benchmark measures it (``verdict_wall_time`` minus the later rank's stamp just
  before its send), and the monitor's own ``detected_after``.

``dl2 analyze`` runs in a fresh process per trace (``--json``, exit status 3 expected);
records/s is the records of all ranks over its wall time (and over its CPU time, which
a loaded machine disturbs less), peak RSS its ``ru_maxrss``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._harness import DL2
from benchmarks._harness import REPO

sys.path.insert(0, str(REPO / "tests"))

from trace_builders import RankBuilder
from trace_builders import write_run_dir

#: ops a builder accumulates before its records are flushed to its file
FLUSH_OPS = 20_000


def write_ring_job(directory: Path, world: int, ops: int) -> int:
    """``ops`` all_reduce calls per rank, then every rank blocks sending to the next;
    returns the number of records written (headers excluded)."""
    builders = [RankBuilder(r, world) for r in range(world)]
    write_run_dir(builders, directory)  # headers
    files = {b.rank: next(directory.glob(f"rank{b.rank:05d}.*")) for b in builders}
    total = 0
    for builder in builders:
        with files[builder.rank].open("a") as handle:
            for done in range(ops):
                builder.call("all_reduce", 10 + done % 7, redop="sum")
                if len(builder.records) >= 4 * FLUSH_OPS:
                    handle.write("".join(builder.records))
                    total += len(builder.records)
                    builder.records.clear()
            builder.call("send", 99, peer=(builder.rank + 1) % world, complete=False)
            handle.write("".join(builder.records))
            total += len(builder.records)
            builder.records.clear()
    return total


#: runs ``dl2 analyze`` in this process and writes its peak RSS (KiB) and CPU seconds
#: to argv[1]
_MEASURED = (
    "import resource, sys\n"
    "from dl2.cli import main\n"
    "code = main(sys.argv[2:])\n"
    "use = resource.getrusage(resource.RUSAGE_SELF)\n"
    "with open(sys.argv[1], 'w') as f:\n"
    "    f.write(f'{use.ru_maxrss} {use.ru_utime + use.ru_stime}')\n"
    "sys.exit(code)\n"
)


def analyze_run(directory: Path) -> dict[str, object]:
    """Run ``dl2 analyze --json`` on it in a fresh process: seconds, peak RSS (MiB)."""
    out = directory / "report.json"
    rss = directory / "rss.txt"
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURED, str(rss), "analyze", str(directory), "--json", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=1800,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 3:
        raise SystemExit(f"dl2 analyze exited {proc.returncode}: {proc.stderr[-2000:]}")
    verdict = json.loads(out.read_text())["verdict"]
    peak, cpu = rss.read_text().split()
    return {"seconds": seconds, "cpu": float(cpu), "rss_mib": int(peak) / 1024, "verdict": verdict}


def trace_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.dl2.jsonl"))


def post_mortem(shapes: list[tuple[int, int]]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for world, ops in shapes:
        with tempfile.TemporaryDirectory(prefix="dl2-model-") as tmp:
            directory = Path(tmp) / "run"
            records = write_ring_job(directory, world, ops)
            size = trace_bytes(directory)
            result = analyze_run(directory)
            row = {
                "ranks": world,
                "ops_per_rank": ops,
                "records": records,
                "trace_mib": round(size / 2**20, 1),
                "seconds": round(float(result["seconds"]), 2),
                "cpu_s": round(float(result["cpu"]), 2),
                "records_per_s": round(records / float(result["seconds"])),
                "records_per_cpu_s": round(records / float(result["cpu"])),
                "peak_rss_mib": round(float(result["rss_mib"])),
                "verdict": result["verdict"],
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def live_latency(history: list[int]) -> list[dict[str, object]]:
    """Seconds from the deadlock's last record to the monitor's proof, after N ops."""
    from dl2.live.monitor import Monitor
    from dl2.live.monitor import MonitorOptions

    sys.path.insert(0, str(REPO / "tests" / "unit"))
    from test_live import FakeJob  # type: ignore[import-not-found]

    rows: list[dict[str, object]] = []
    for ops in history:
        with tempfile.TemporaryDirectory(prefix="dl2-live-") as tmp:
            directory = Path(tmp) / "run"
            builders = [RankBuilder(r, 2) for r in range(2)]
            write_run_dir(builders, directory)
            files = [next(directory.glob(f"rank{r:05d}.*")) for r in range(2)]
            job = FakeJob(2)
            monitor = Monitor(
                directory, job, MonitorOptions(poll_interval=0.2), notice=lambda _m: None
            )
            for builder, path in zip(builders, files, strict=True):
                with path.open("a") as handle:
                    for done in range(ops):
                        builder.call("all_reduce", 10 + done % 7, redop="sum")
                        if len(builder.records) >= 4 * FLUSH_OPS:
                            handle.write("".join(builder.records))
                            builder.records.clear()
                            monitor.step()  # the monitor follows the job as it runs
                    handle.write("".join(builder.records))
                    builder.records.clear()
            monitor.step()
            for builder, path in zip(builders, files, strict=True):
                builder.call("send", 99, peer=1 - builder.rank, complete=False)
                with path.open("a") as handle:
                    handle.write("".join(builder.records))
                builder.records.clear()
            started = time.perf_counter()
            cpu = time.process_time()
            polls = 0
            outcome = None
            while outcome is None and time.perf_counter() - started < 600:
                outcome = monitor.step()
                polls += 1
                if outcome is None:
                    time.sleep(0.05 if monitor._confirm_soon else 0.2)
            row = {
                "ops_per_rank": ops,
                "verdict_after_s": round(time.perf_counter() - started, 2),
                "monitor_cpu_s": round(time.process_time() - cpu, 3),
                "polls": polls,
                "reason": outcome.reason if outcome is not None else None,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def real_runs(history: list[int]) -> list[dict[str, object]]:
    """Verdict latency of a real 2-rank job after N all_reduce calls (``dl2 run``)."""
    import os

    from benchmarks._harness import kill_group
    from benchmarks._harness import start_logged
    from benchmarks.online import BLOCK
    from benchmarks.online import CASES

    rows: list[dict[str, object]] = []
    for steps in history:
        with tempfile.TemporaryDirectory(prefix="dl2-run-") as tmp:
            run_dir = Path(tmp) / "run"
            env = dict(os.environ, OMP_NUM_THREADS="1", DL2_BENCH_STEPS=str(steps))
            command = [str(DL2), "run", "--run-dir", str(run_dir), "-n", "2"]
            log = Path(tmp) / "log"
            started = time.monotonic()
            with log.open("wb") as out:
                proc = start_logged([*command, "long_send_send.py"], out, env, CASES)
                try:
                    code = proc.wait(timeout=1800)
                finally:
                    kill_group(proc.pid)
                    proc.wait()
            meta = json.loads((run_dir / "run.json").read_text())
            stamps = [float(t) for _, t in BLOCK.findall(log.read_text(errors="replace"))]
            wall = meta.get("verdict_wall_time")
            row = {
                "ops_per_rank": steps,
                "exit": code,
                "run_s": round(time.monotonic() - started, 1),
                "latency_s": round(wall - max(stamps), 3) if wall and stamps else None,
                "detected_after_s": meta.get("detected_after"),
                "trace_mib": round(sum(p.stat().st_size for p in run_dir.glob("*.jsonl")) / 2**20),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def sizes(argv: list[str], name: str, default: list[int], quick: bool) -> list[int]:
    """``--NAME=N[,N...]`` from the arguments, else ``default`` (``--quick``: the first)."""
    prefix = f"--{name}="
    given = next((a[len(prefix) :] for a in argv if a.startswith(prefix)), None)
    found = [int(n) for n in given.split(",")] if given else default
    return found[:1] if quick else found


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    only = next((a.split("=", 1)[1] for a in argv if a.startswith("--only=")), None)
    parts = set(only.split(",")) if only else {"history", "world", "live", "run"}
    if shutil.which(str(DL2)) is None:
        print(f"no {DL2}: run `make install` first")
        return 2
    if "history" in parts:
        print("== post-mortem, history: 8 ranks x N all_reduce, then a ring deadlock")
        post_mortem([(8, n) for n in sizes(argv, "history", [25_000, 50_000, 100_000], quick)])
    if "world" in parts:
        print("== post-mortem, world: W ranks x 100 all_reduce, then a W-rank ring deadlock")
        post_mortem([(w, 100) for w in sizes(argv, "world", [512, 1024, 2048], quick)])
    if "live" in parts:
        print("== live: 2 ranks x N all_reduce, then a send/send deadlock")
        live_latency(sizes(argv, "live", [20_000, 100_000, 1_000_000], quick))
    if "run" in parts:
        print("== run: dl2 run -n 2, N all_reduce, then a send/send deadlock")
        real_runs(sizes(argv, "run", [2_000, 20_000, 100_000], quick))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
