"""What a trace costs on disk: bytes per op, and the disk a rank uses after many ops.

Run ``python -m benchmarks tracesize`` (``--quick``: 10^5 ops instead of 10^6 in the
last figure).  One process, a one-rank gloo group recorded by dl2 as ``dl2 run`` records
it, with the default retention (``DL2_KEEP``, ``DL2_SEGMENT_BYTES`` unset):

* a loop of blocking ``all_reduce`` of one tensor from one line: trace bytes per op
  (all its records together: op, issue, wait, wait's return);
* DDP steps of a GPT-2-like model (bucket 1 MB): bytes per step and per collective
  (the watchdog's ``done`` records of the bucket all_reduces included);
* 10^6 blocking ``all_reduce`` through the recorder with gloo replaced by an already
  complete work: the disk the rank's trace then uses (segments kept, bytes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HARD_TIMEOUT_S = 600


def _bytes(rec: Any) -> int:
    """Bytes of the rank's trace on disk (every segment, all kept at these sizes)."""
    rec.flush()
    return sum(f.stat().st_size for f in Path(rec.run_dir).iterdir())


def child(run_dir: str, big: int) -> dict[str, Any]:
    import dl2.record

    assert dl2.record.install(run_dir)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from benchmarks.record_overhead import _gpt2ish
    from benchmarks.record_overhead import train_step

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.group.WORLD
    rec = group._dl2_rec
    result: dict[str, Any] = {"torch": torch.__version__}

    t = torch.ones(8)
    for _ in range(100):
        dist.all_reduce(t)  # the stack and the description are defined once
    before, n = _bytes(rec), 20_000
    for _ in range(n):
        dist.all_reduce(t)
    result["blocking"] = (_bytes(rec) - before) / n

    model = DistributedDataParallel(_gpt2ish(), bucket_cap_mb=1)
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    tokens = torch.randint(0, 512, (4, 64))

    def step() -> None:
        train_step(model, optim, tokens)

    for _ in range(3):
        step()
    time.sleep(0.5)  # the watchdog writes the done records of the last step
    before, ids, steps = _bytes(rec), next(rec.ids), 30
    for _ in range(steps):
        step()
    time.sleep(0.5)
    result["ddp_step"] = (_bytes(rec) - before) / steps
    result["ddp_ops"] = (next(rec.ids) - ids - 1) / steps  # async: one id per collective

    work = group._dl2_inner.allreduce([t])
    work.wait()

    class Complete:
        def allreduce(self, *args: Any, **kwargs: Any) -> Any:
            return work

    group._dl2_inner = Complete()
    started = time.perf_counter()
    for _ in range(big):
        dist.all_reduce(t)
    result["big_s"] = time.perf_counter() - started
    rec.flush()
    files = sorted(Path(run_dir).iterdir())
    last = rec.writer.segment
    result["big"] = {
        "ops": big,
        "written": (last * rec.writer.segment_bytes + files[-1].stat().st_size),
        "segment_bytes": rec.writer.segment_bytes,
        "keep": rec.writer.keep,
        "files": [f.name for f in files],
        "disk": sum(f.stat().st_size for f in files),
    }
    dist.destroy_process_group()
    return result


def report(result: dict[str, Any]) -> str:
    big = result["big"]
    mib = 1 << 20
    return "\n".join(
        [
            f"dl2 trace size: torch {result['torch']}, gloo, one rank, default retention",
            f"  blocking all_reduce in a loop: {result['blocking']:.1f} bytes per op "
            "(op + issue + wait + return)",
            f"  DDP step (GPT-2-like, bucket 1 MB, {result['ddp_ops']:.0f} collectives): "
            f"{result['ddp_step']:.0f} bytes per step, "
            f"{result['ddp_step'] / max(result['ddp_ops'], 1):.1f} per collective",
            f"  after {big['ops']:,} more blocking all_reduce ({result['big_s']:.0f} s): "
            f"{big['written'] / mib:.1f} MiB written, {len(big['files'])} segment(s) kept of "
            f"{big['segment_bytes'] / mib:.0f} MiB (keep {big['keep'] or 'all'}), "
            f"{big['disk'] / mib:.1f} MiB on disk; bound "
            f"{big['keep'] * big['segment_bytes'] / mib:.0f} MiB",
        ]
    )


def measure(big: int) -> dict[str, Any] | None:
    """The figures (see :func:`child`) of a child process recording ``big`` ops last;
    None if it failed."""
    with tempfile.TemporaryDirectory(prefix="dl2-size-") as tmp:
        out = Path(tmp) / "result.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DL2_")}
        env.update(
            OMP_NUM_THREADS="1",
            PYTHONWARNINGS="ignore",
            PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]),
        )
        command = [sys.executable, __file__, "--child", str(Path(tmp) / "run"), str(out)]
        done = subprocess.run([*command, str(big)], env=env, timeout=HARD_TIMEOUT_S)
        if done.returncode != 0 or not out.exists():
            return None
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def main(argv: list[str] | None = None) -> int:
    """Measure and print the figures; ``--quick`` for 10^5 ops in the last one."""
    args = sys.argv[1:] if argv is None else argv
    big = 100_000 if "--quick" in args else 1_000_000
    result = measure(big)
    if result is None:
        print("benchmark failed", file=sys.stderr)
        return 1
    print(report(result))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        Path(sys.argv[3]).write_text(json.dumps(child(sys.argv[2], int(sys.argv[4]))))
    else:
        sys.exit(main())
