"""Nondeterministic communication bugs: how often they manifest, and does dl2 flag every run.

Run ``python -m benchmarks nondet [--quick] [--runs N] [--json PATH]``.  Two workloads
(``benchmarks/workloads_nd``), each over buffer sizes {0, 1 KiB, 64 KiB, 1 MiB, 4 MiB}
x fusion counts {1, 2, 4, 8}:

* ``fusion``: gradient fusion in each rank's own ready order (random per-rank delays),
  buckets of at most F tensors or B bytes, ``all_reduce_coalesced`` per bucket.  B is the
  fusion buffer (the same value is also set as the emulated eager-send buffer, which
  this workload, having no sends, does not use).
* ``exchange``: both ranks send their K tensors, fused F at a time, before receiving,
  under an emulated eager buffer of B bytes (``DL2_BUFFER_SIZE``, as ``dl2 run
  --buffer-size`` sets it).

Each run is a real 2-rank gloo job with dl2's recorder and live monitor, as ``dl2 run``
has them; to afford hundreds of runs on two cores, the ranks are forked from this
process (torch imported once) instead of started as fresh interpreters, and the monitor
follows them through a :class:`~dl2.live.launcher.Job` over the forked pids.  Per run:

* manifested: the job failed (gloo abort, a deadlock dl2 stopped, a wrong sum, a hang);
* flagged: dl2's verdict on the run is deadlock or defect, or, for a run that completed
  cleanly, dl2's prediction finds a divergence: ``dl2 predict --fusion`` for the fusion
  workload, the prediction under the run's own (emulated) configuration for the
  exchange.

Ground truth per configuration ("can break"): for the exchange, whether its largest
message exceeds the buffer; for the fusion, whether two ready orders (any timing) fuse
different tensors together, by enumerating every order of the K tensors.  dl2 is right
on a run when it flags exactly the runs of configurations that can break.  The
prediction time (analysis of the recorded run: load, graphs, predictions) is set
against the wall time of the run itself, and a few runs are also timed through the
``dl2 run`` command line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._harness import markdown_table

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

BUFFERS = (0, 1 << 10, 64 << 10, 1 << 20, 4 << 20)
COUNTS = (1, 2, 4, 8)
WORKLOADS = ("fusion", "exchange")
RUNS, QUICK_RUNS = 6, 3
#: seconds a run may go without proof of anything before the monitor stops it
HANG_TIMEOUT_S = 10.0
#: `dl2 run` launches timed for the comparison (first configurations of each workload)
CLI_RUNS, QUICK_CLI_RUNS = 3, 1
HARD_TIMEOUT_S = 3600


def _label(size: int) -> str:
    for shift, unit in ((20, "MiB"), (10, "KiB")):
        if size and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


# -- the workloads' ground truth ----------------------------------------------------------


def _fusion_module() -> Any:
    from benchmarks.workloads_nd import fusion

    return fusion


def _exchange_module() -> Any:
    from benchmarks.workloads_nd import exchange

    return exchange


def can_break(workload: str, buffer: int, count: int) -> bool:
    """Whether some run of this configuration can fail (any timing)."""
    if workload == "exchange":
        return bool(_exchange_module().largest_message(count) > buffer)
    fusion = _fusion_module()
    nbytes = [n * fusion.ITEMSIZE for n in fusion.SIZES]
    seen = set()
    for order in itertools.permutations(range(len(nbytes))):
        parts = fusion.buckets(order, nbytes, count, buffer)
        seen.add(tuple(tuple(sorted(b)) for b in parts))
        if len(seen) > 1:
            return True
    return False


def model_probability(buffer: int, count: int, runs: int = 4000) -> float:
    """The fusion workload's chance to break under its own timing model (simulated)."""
    fusion = _fusion_module()
    nbytes = [n * fusion.ITEMSIZE for n in fusion.SIZES]
    args = fusion.parse([])
    broke = 0
    for seed in range(runs):
        for step in range(args.steps):
            parts = []
            for rank in range(2):
                rng = random.Random(seed * 1_000_003 + step * 1009 + rank)
                order = [
                    i for _, i in fusion.ready_order(rng, len(nbytes), args.gap_ms, args.jitter_ms)
                ]
                parts.append([sorted(b) for b in fusion.buckets(order, nbytes, count, buffer)])
            if parts[0] != parts[1]:
                broke += 1
                break
    return broke / runs


# -- one run: forked ranks under the live monitor -------------------------------------------


class _Forked:
    """A forked rank, with the part of Popen's interface that launcher.Job uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(
    rank: int, port: int, run_dir: Path, workload: str, argv: list[str], buffer: int
) -> int:
    os.setsid()  # its own process group, as dl2 run starts ranks
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "DL2_BUFFER_SIZE": str(buffer),
            "OMP_NUM_THREADS": "1",
        }
    )
    from dl2.record import install

    install(str(run_dir))
    module = _fusion_module() if workload == "fusion" else _exchange_module()
    import warnings

    warnings.simplefilter("ignore")
    return int(module.main(argv))


@dataclass
class Run:
    """One run's facts."""

    workload: str
    buffer: int
    count: int
    seed: int
    exit_code: int
    reason: str
    verdict: str
    manifested: bool
    flagged: bool
    predicted: bool
    wall_s: float
    predict_s: float
    threshold: int | None = None


def one_run(workload: str, buffer: int, count: int, seed: int, root: Path) -> Run:
    from dl2.live.launcher import Job
    from dl2.live.monitor import Monitor
    from dl2.live.monitor import MonitorOptions

    run_dir = root / f"{workload}-{buffer}-{count}-{seed}"
    run_dir.mkdir(parents=True)
    argv = ["--fusion-count", str(count), "--seed", str(seed)]
    if workload == "fusion":
        argv += ["--fusion-bytes", str(buffer)]
    port = _free_port()
    start = time.monotonic()
    procs: dict[int, Any] = {}
    for rank in range(2):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _rank_main(rank, port, run_dir, workload, argv, buffer)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        procs[rank] = _Forked(pid)
    job = Job(procs, ranked=True)
    options = MonitorOptions(
        poll_interval=0.05, hang_timeout=HANG_TIMEOUT_S, suspect_after=HANG_TIMEOUT_S
    )
    try:
        outcome = Monitor(run_dir, job, options, notice=lambda message: None).run()
    finally:
        if not job.finished():
            job.stop()
    wall = time.monotonic() - start
    report = outcome.report
    verdict = report.verdict.value if report is not None else "no-trace"
    exit_code = outcome.job_exit_code
    manifested = outcome.reason != "finished" or exit_code != 0
    t0 = time.perf_counter()
    predicted, threshold = _predict(run_dir, workload) if not manifested else (False, None)
    predict_s = time.perf_counter() - t0
    flagged = verdict in ("deadlock", "defect") or predicted
    return Run(
        workload,
        buffer,
        count,
        seed,
        exit_code,
        outcome.reason,
        verdict,
        manifested,
        flagged,
        predicted,
        wall,
        predict_s,
        threshold,
    )


def _predict(run_dir: Path, workload: str) -> tuple[bool, int | None]:
    """What dl2 predicts for a run that completed: (flagged, the exchange's threshold)."""
    from dl2.analysis.prediction.fusion import fusion_witnesses
    from dl2.analysis.prediction.program import build_program
    from dl2.analysis.prediction.search import Predictor
    from dl2.analysis.prediction.semantics import eager
    from dl2.analysis.prediction.semantics import recorded_semantics
    from dl2.model.execution_graph import build_execution_graph
    from dl2.trace.session import load_session

    session = load_session(run_dir)
    graph = build_execution_graph(session)
    if workload == "fusion":
        return bool(fusion_witnesses(graph, assume=True)), None
    recorded = recorded_semantics(session)
    predictor = Predictor(build_program(graph))
    own = predictor.predict(recorded or eager(0), recorded=recorded, thresholds=False)
    rendezvous = predictor.predict(eager(0), recorded=recorded)
    thresholds = [w.threshold for w in rendezvous.witnesses if w.threshold is not None]
    return own.deadlock_possible, (max(thresholds) if thresholds else None)


def cli_run(workload: str, buffer: int, count: int, root: Path) -> float:
    """Wall seconds of one `dl2 run` of the workload (fresh interpreters)."""
    script = REPO / "benchmarks" / "workloads_nd" / f"{workload}.py"
    argv = ["--fusion-count", str(count), "--seed", "1"]
    if workload == "fusion":
        argv += ["--fusion-bytes", str(buffer)]
    dl2 = Path(sys.executable).with_name("dl2")
    command = [
        str(dl2),
        "run",
        "--buffer-size",
        str(buffer),
        "--run-dir",
        str(root / f"cli-{workload}-{buffer}-{count}"),
        "--hang-timeout",
        str(HANG_TIMEOUT_S),
        "-n",
        "2",
        str(script),
        *argv,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    start = time.monotonic()
    proc = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return time.monotonic() - start


# -- the table ------------------------------------------------------------------------------


def summarize(
    runs: list[Run], truth: dict[tuple[str, int, int], bool], model: dict[tuple[int, int], float]
) -> list[dict[str, Any]]:
    rows = []
    for (workload, buffer, count), breaks in truth.items():
        mine = [r for r in runs if (r.workload, r.buffer, r.count) == (workload, buffer, count)]
        if not mine:
            continue
        right = sum(1 for r in mine if r.flagged == breaks)
        rows.append(
            {
                "workload": workload,
                "buffer": buffer,
                "count": count,
                "runs": len(mine),
                "can_break": breaks,
                "manifested": sum(r.manifested for r in mine),
                "flagged": sum(r.flagged for r in mine),
                "right": right,
                "model_p": model.get((buffer, count)) if workload == "fusion" else float(breaks),
                "thresholds": sorted({r.threshold for r in mine if r.threshold is not None}),
                "run_s": statistics.median(r.wall_s for r in mine),
                "predict_s": statistics.median(r.predict_s for r in mine if not r.manifested)
                if any(not r.manifested for r in mine)
                else None,
                "verdicts": sorted({r.verdict for r in mine}),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    header = [
        "workload",
        "buffer B",
        "fusion F",
        "can break",
        "manifested",
        "model p",
        "dl2 right",
        "verdicts",
        "predicted threshold",
        "run (median s)",
        "prediction (median ms)",
    ]
    cells = []
    for row in rows:
        n = row["runs"]
        predict = f"{row['predict_s'] * 1000:.0f}" if row["predict_s"] is not None else "-"
        thresholds = ", ".join(f"{t:,}" for t in row["thresholds"]) or "-"
        model = f"{row['model_p']:.2f}" if row["model_p"] is not None else "-"
        cells.append(
            [
                f"{row['workload']}",
                _label(row["buffer"]),
                f"{row['count']}",
                "yes" if row["can_break"] else "no",
                f"{row['manifested']}/{n} ({row['manifested'] / n:.2f})",
                model,
                f"{row['right']}/{n}",
                ", ".join(row["verdicts"]),
                thresholds,
                f"{row['run_s']:.2f}",
                predict,
            ]
        )
    return markdown_table(header, cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks nondet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs per configuration")
    parser.add_argument("--runs", type=int, help=f"runs per configuration (default {RUNS})")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--json", metavar="PATH", help="write every run and the table here")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args(argv)
    quick = args.quick or os.environ.get("DL2_BENCH_QUICK") == "1"
    runs_per = args.runs or (QUICK_RUNS if quick else RUNS)
    workloads = [w for w in args.workloads.split(",") if w]
    signal.signal(
        signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("benchmark ran too long"))
    )
    signal.alarm(HARD_TIMEOUT_S)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch.distributed  # imported once: the forked ranks share it

    assert torch.distributed.is_available()

    root = Path(tempfile.mkdtemp(prefix="dl2-nondet-"))
    started = time.monotonic()
    truth = {(w, b, f): can_break(w, b, f) for w in workloads for b in BUFFERS for f in COUNTS}
    model = (
        {(b, f): model_probability(b, f) for b in BUFFERS for f in COUNTS}
        if "fusion" in workloads
        else {}
    )
    runs: list[Run] = []
    try:
        for workload in workloads:
            for buffer in BUFFERS:
                for count in COUNTS:
                    for seed in range(runs_per):
                        runs.append(one_run(workload, buffer, count, seed, root))
                    done = [
                        r
                        for r in runs
                        if (r.workload, r.buffer, r.count) == (workload, buffer, count)
                    ]
                    print(
                        f"{workload:8s} B={_label(buffer):>7s} F={count}: manifested "
                        f"{sum(r.manifested for r in done)}/{len(done)}, flagged "
                        f"{sum(r.flagged for r in done)}/{len(done)}, can break: "
                        f"{truth[(workload, buffer, count)]}",
                        flush=True,
                    )
        cli = []
        for workload in workloads:
            for buffer, count in [(4 << 20, 8), (1 << 20, 2), (0, 1)][
                : QUICK_CLI_RUNS if quick else CLI_RUNS
            ]:
                cli.append(
                    {
                        "workload": workload,
                        "buffer": buffer,
                        "count": count,
                        "wall_s": cli_run(workload, buffer, count, root),
                    }
                )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    elapsed = time.monotonic() - started
    rows = summarize(runs, truth, model)
    print()
    print(markdown(rows))
    right = sum(r["right"] for r in rows)
    total = sum(r["runs"] for r in rows)
    breaking = [r for r in runs if truth[(r.workload, r.buffer, r.count)]]
    safe = [r for r in runs if not truth[(r.workload, r.buffer, r.count)]]
    predicted_runs = [r for r in runs if not r.manifested]
    print()
    print(
        f"dl2 right on {right}/{total} runs: flagged "
        f"{sum(r.flagged for r in breaking)}/{len(breaking)} "
        f"runs of configurations that can break (manifested or not), "
        f"{sum(r.flagged for r in safe)}/{len(safe)} of those that cannot"
    )
    if predicted_runs:
        print(
            "prediction on a completed run: median "
            f"{statistics.median(r.predict_s for r in predicted_runs) * 1000:.0f} ms, "
            f"max {max(r.predict_s for r in predicted_runs) * 1000:.0f} ms; one forked run: "
            f"median {statistics.median(r.wall_s for r in runs):.2f} s"
        )
    for entry in cli:
        print(
            f"`dl2 run` of {entry['workload']} (B={_label(entry['buffer'])}, "
            f"F={entry['count']}): {entry['wall_s']:.1f} s wall"
        )
    print(f"{len(runs)} runs in {elapsed:.0f} s ({runs_per} per configuration)")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rows": rows,
                    "runs": [asdict(r) for r in runs],
                    "cli": cli,
                    "elapsed_s": elapsed,
                    "runs_per": runs_per,
                },
                indent=1,
            )
        )
    return 0 if right == total else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
