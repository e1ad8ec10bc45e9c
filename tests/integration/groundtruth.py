"""Run integration cases under plain gloo, without dl2, to establish their ground truth.

Usage::

    .venv/bin/python tests/integration/groundtruth.py [--timeout 20] [-j JOBS] [CASE ...]

Each case is launched like torchrun would (one process per rank, RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT in the environment), every rank in its own session so that a
hanging rank can be killed with its children. Prints one line per case: what plain gloo
did (``hang``, ``exit 0`` or the ranks' exit statuses and times) and whether that agrees
with the case's ``dl2-case`` label, followed by what the ranks printed (``-v``).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import as_completed
from pathlib import Path

CASES = Path(__file__).resolve().parent / "cases"
HEADER = re.compile(r"^#\s*dl2-case:\s*(.*)$", re.MULTILINE)


def header(path: Path) -> dict[str, str]:
    match = HEADER.search(path.read_text())
    if match is None:
        raise SystemExit(f"{path}: no dl2-case header")
    return dict(item.split("=", 1) for item in match.group(1).split())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def signame(rc: int) -> str:
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit {rc}"


def run_case(path: Path, timeout: float, verbose: bool) -> tuple[list[str], bool]:
    meta = header(path)
    world = int(meta["world"])
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    outdir = Path(tempfile.mkdtemp(prefix="dl2-gt-"))
    start = time.monotonic()
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        out = (outdir / f"rank{rank}.log").open("wb")
        procs.append(
            subprocess.Popen(
                [sys.executable, str(path)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    ended: dict[int, tuple[int, float]] = {}
    while len(ended) < world and time.monotonic() - start < timeout:
        for rank, proc in enumerate(procs):
            if rank not in ended and proc.poll() is not None:
                ended[rank] = (proc.returncode, time.monotonic() - start)
        time.sleep(0.02)
    hanging = [rank for rank in range(world) if rank not in ended]
    for rank in hanging:
        os.killpg(procs[rank].pid, signal.SIGKILL)
        procs[rank].wait()
    parts = []
    for rank in range(world):
        if rank in ended:
            rc, when = ended[rank]
            parts.append(f"r{rank}:{signame(rc)}@{when * 1000:.0f}ms")
        else:
            parts.append(f"r{rank}:running")
    if hanging:
        observed = f"hang (still running after {timeout:.0f}s: ranks {hanging})"
    elif all(rc == 0 for rc, _ in ended.values()):
        observed = "exit 0"
    else:
        observed = "crash"
    label = meta["label"]
    agrees = (
        (label == "deadlock" and bool(hanging))
        or (label == "ok" and observed == "exit 0")
        or (label == "defect" and not hanging)
    )
    verdict = "OK " if agrees else "BAD"
    report = [f"{verdict} {path.name:45} {label:8} {observed}  [{' '.join(parts)}]"]
    if verbose or not agrees:
        for rank in range(world):
            text = (outdir / f"rank{rank}.log").read_text(errors="replace").strip()
            lines = [ln for ln in text.splitlines() if ln.strip()][-12:]
            report.extend(f"      r{rank}| {line[:200]}" for line in lines)
    return report, agrees


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", type=Path)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="cases run at once")
    args = parser.parse_args()
    cases = args.cases or sorted(p for p in CASES.glob("*.py") if not p.name.startswith("_"))
    bad = 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_case, case, args.timeout, args.verbose) for case in cases]
        for future in as_completed(futures):
            report, agrees = future.result()
            print("\n".join(report), flush=True)
            bad += not agrees
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
