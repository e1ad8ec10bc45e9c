"""What recording costs: per small all_reduce, and per DDP training step.

Run ``python benchmarks/record_overhead.py`` or ``python -m benchmarks record`` (under a
minute; ``--quick`` for a smaller run; killed after ``HARD_TIMEOUT_S``).  It starts a
2-rank gloo job on 127.0.0.1 whose ranks hold two process groups over the same ranks:
the default group, recorded by dl2, and a plain gloo group built while dl2's backend
swap is turned off.  Work on the two alternates block by block (ABBA order), so both
see the same machine load, and the figures are medians of per-block differences:

* per-op cost: 2000 all_reduce of 8 float32 on each group (40 blocks of 50), wall time
  and the calling thread's CPU time (the CPU figure is less sensitive to a busy machine);
* recording cost alone: the same calls on the recorded group with gloo replaced by a
  work that is already complete, with recording on vs off (no network, no scheduling),
  in 400 short blocks of 50 calls each way; wall and CPU time;
* DDP: a GPT-2-like stack (embedding, 2 transformer blocks of width 128, LM head),
  one DDP model per group, steps alternating; the step-time ratio recorded / plain;
* where a DDP step's extra CPU goes: the same stack in small buckets (many recorded
  collectives per step), steps rotating between the plain group, the recorded group
  with recording switched off (the wrapper alone: the reducer's calls crossing into
  Python and back) and with it on; per step and per recorded collective.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

HARD_TIMEOUT_S = 240
WORLD = 2
QUICK = os.environ.get("DL2_BENCH_QUICK") == "1"
BLOCKS, BLOCK_OPS = (10, 50) if QUICK else (40, 50)  # 2000 ops per group
# Recording alone: many short blocks.  A block must be much shorter than a scheduler time
# slice: with blocks of 500 ops (5 ms recorded, 1 ms not) a slice given to another
# process lands in most recorded blocks and in few plain ones, and the median delta
# doubled or tripled under load (14-28 us for 8-9 us of CPU); with 50-op blocks the
# median wall delta matches the CPU figure.
ALONE_BLOCKS, ALONE_OPS = (100, 50) if QUICK else (400, 50)  # 20000 ops each way
DDP_WARMUP, DDP_STEPS = (2, 8) if QUICK else (8, 128)
SPLIT_BUCKET_MB, SPLIT_STEPS = 0.05, (8 if QUICK else 96)

REPO = Path(__file__).resolve().parents[1]


# -- the ranks ----------------------------------------------------------------------------


def _per_op(fn: Any, n: int) -> tuple[float, float]:
    """(wall µs, calling-thread CPU µs) per call of ``fn`` over ``n`` calls."""
    c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1e3, (time.thread_time_ns() - c0) / n / 1e3


def _gpt2ish() -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(width, 4, batch_first=True)
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.mlp = nn.Sequential(
                nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
            )

        def forward(self, x: Any) -> Any:
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class Model(nn.Module):
        def __init__(self, vocab: int = 512, width: int = 128, layers: int = 2) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.Sequential(*(Block(width) for _ in range(layers)))
            self.head = nn.Linear(width, vocab)

        def forward(self, tokens: Any) -> Any:
            return self.head(self.blocks(self.embed(tokens)))

    torch.manual_seed(0)
    return Model()


def ddp_models(groups: dict[str, Any], bucket_mb: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """One DDP model of :func:`_gpt2ish` per named group, and an SGD optimiser each."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    models = {
        name: DistributedDataParallel(_gpt2ish(), process_group=group, bucket_cap_mb=bucket_mb)
        for name, group in groups.items()
    }
    return models, {n: torch.optim.SGD(m.parameters(), lr=0.01) for n, m in models.items()}


def train_step(model: Any, optim: Any, tokens: Any) -> None:
    """One training step of a language model on ``tokens``: forward, loss, backward
    (DDP's bucket collectives), optimiser step."""
    import torch

    logits = model(tokens)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    optim.step()
    optim.zero_grad()


def rank_main(out_path: str) -> None:
    faulthandler.dump_traceback_later(HARD_TIMEOUT_S - 10, exit=True)
    import dl2.record

    install_module = importlib.import_module("dl2.record.install")
    assert dl2.record.install(os.environ["BENCH_RUN_DIR"])
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    recorded = dist.group.WORLD
    # The plain group: neither swapped for dl2's backend nor wrapped as a device group.
    with (
        mock.patch.object(install_module, "translate_backend", lambda backend: None),
        mock.patch.object(install_module, "_device_target", lambda *args: None),
    ):
        plain = dist.new_group(backend="gloo")
    assert type(recorded).__name__ == "RecordingProcessGroup"
    assert type(plain).__name__ == "ProcessGroup"
    try:
        from dl2.speedups import active as c_active
    except ImportError:  # a dl2 from before its C part (an A/B against an older commit)
        c_active = bool
    result: dict[str, Any] = {"torch": torch.__version__, "c": c_active()}
    result["config"] = {"blocks": BLOCKS, "warmup": DDP_WARMUP, "steps": DDP_STEPS}

    # Per-op: interleaved blocks of small all_reduce.
    t = torch.ones(8)
    for group in (recorded, plain) * 3:  # warm up both
        _per_op(lambda g=group: dist.all_reduce(t, group=g), 50)
    wall: dict[str, list[float]] = {"rec": [], "plain": []}
    cpu: dict[str, list[float]] = {"rec": [], "plain": []}
    for block in range(BLOCKS):
        order = (("rec", recorded), ("plain", plain))
        for name, group in order if block % 2 == 0 else order[::-1]:  # ABBA...
            dist.barrier(group=plain)
            w, c = _per_op(lambda g=group: dist.all_reduce(t, group=g), BLOCK_OPS)
            wall[name].append(w)
            cpu[name].append(c)
    result["op"] = {"wall": wall, "cpu": cpu}

    # Recording cost alone: gloo swapped for an already-complete work, recording on/off.
    work = recorded._dl2_inner.allreduce([t])
    work.wait()

    class Complete:
        def allreduce(self, *args: Any, **kwargs: Any) -> Any:
            return work

    rec = recorded._dl2_rec
    inner, fd = recorded._dl2_inner, rec.fd
    recorded._dl2_inner = Complete()  # type: ignore
    alone: dict[str, list[float]] = {"on": [], "off": []}
    alone_cpu: dict[str, list[float]] = {"on": [], "off": []}
    try:
        for _ in range(ALONE_BLOCKS):
            for name, on in (("on", True), ("off", False)):
                rec.fd = fd if on else -1
                w, c = _per_op(lambda: dist.all_reduce(t, group=recorded), ALONE_OPS)
                alone[name].append(w)
                alone_cpu[name].append(c)
    finally:
        rec.fd, recorded._dl2_inner = fd, inner
    result["alone"] = alone
    result["alone_cpu"] = alone_cpu

    # DDP: one model per group, steps alternating.
    models, optims = ddp_models({"rec": recorded, "plain": plain}, 1)
    torch.manual_seed(1 + rank)
    tokens = torch.randint(0, 512, (4, 64))
    steps: dict[str, list[float]] = {"rec": [], "plain": []}
    step_cpu: dict[str, list[float]] = {"rec": [], "plain": []}
    params = sum(p.numel() for p in models["rec"].parameters())
    per_step = 0  # the recorded group's collectives in one step
    for step in range(DDP_WARMUP + DDP_STEPS):
        order = ("rec", "plain") if step % 2 == 0 else ("plain", "rec")
        for name in order:
            dist.barrier(group=plain)
            seq = recorded._dl2_seq
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            train_step(models[name], optims[name], tokens)
            if step >= DDP_WARMUP:
                steps[name].append((time.perf_counter_ns() - t0) / 1e6)
                step_cpu[name].append((time.thread_time_ns() - c0) / 1e6)
            if name == "rec":
                per_step = recorded._dl2_seq - seq
    result["ddp"] = {"steps": steps, "cpu": step_cpu, "params": params, "collectives": per_step}
    result["split"] = _split_steps(recorded, plain, tokens)
    dist.destroy_process_group()
    if rank == 0:
        Path(out_path).write_text(json.dumps(result))


def _split_steps(recorded: Any, plain: Any, tokens: Any) -> dict[str, Any]:
    """CPU per DDP step in small buckets: plain, recorded with recording off, and on."""
    import torch.distributed as dist

    models, optims = ddp_models({"rec": recorded, "plain": plain}, SPLIT_BUCKET_MB)
    rec = recorded._dl2_rec
    fd = rec.fd
    kinds = (("on", "rec"), ("off", "rec"), ("plain", "plain"))
    cpu: dict[str, list[float]] = {kind: [] for kind, _ in kinds}
    per_step = 0
    try:
        for step in range(DDP_WARMUP + SPLIT_STEPS):
            for kind, name in kinds[step % 3 :] + kinds[: step % 3]:  # rotating order
                rec.fd = -1 if kind == "off" else fd
                dist.barrier(group=plain)
                seq, c0 = recorded._dl2_seq, time.thread_time_ns()
                train_step(models[name], optims[name], tokens)
                if step >= DDP_WARMUP:
                    cpu[kind].append((time.thread_time_ns() - c0) / 1e3)
                if kind == "on":
                    per_step = recorded._dl2_seq - seq
    finally:
        rec.fd = fd
    return {"cpu": cpu, "collectives": per_step}


# -- the launcher -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _median_delta(a: list[float], b: list[float]) -> float:
    return statistics.median(x - y for x, y in zip(a, b, strict=True))


def report(result: dict[str, Any]) -> str:
    wall, cpu = result["op"]["wall"], result["op"]["cpu"]
    alone, alone_cpu = result["alone"], result["alone_cpu"]
    steps, step_cpu = result["ddp"]["steps"], result["ddp"]["cpu"]

    def ratio(figures: dict[str, list[float]]) -> float:
        return statistics.median(figures["rec"]) / statistics.median(figures["plain"])

    config = result["config"]
    blocks, steps_n = config["blocks"], config["steps"]
    per_step = result["ddp"]["collectives"]
    lines = [
        f"dl2 recording overhead: torch {result['torch']}, gloo, {WORLD} ranks on 127.0.0.1, "
        "OMP_NUM_THREADS=1, recorder "
        + ("with its C hot path" if result.get("c") else "in pure Python (no dl2._speedups)"),
        f"all_reduce of 8 float32, {blocks} interleaved blocks of {BLOCK_OPS} per group "
        f"({blocks * BLOCK_OPS} ops each):",
        f"  wall per op:        plain {statistics.median(wall['plain']):7.1f} us   "
        f"recorded {statistics.median(wall['rec']):7.1f} us   "
        f"median delta {_median_delta(wall['rec'], wall['plain']):+6.1f} us",
        f"  caller CPU per op:  plain {statistics.median(cpu['plain']):7.1f} us   "
        f"recorded {statistics.median(cpu['rec']):7.1f} us   "
        f"median delta {_median_delta(cpu['rec'], cpu['plain']):+6.1f} us",
        f"  recording alone (gloo replaced by a complete work, on vs off): "
        f"median {_median_delta(alone['on'], alone['off']):.1f} us, "
        f"best {min(alone['on']) - min(alone['off']):.1f} us per op; "
        f"CPU {_median_delta(alone_cpu['on'], alone_cpu['off']):.1f} us",
        f"DDP, GPT-2-like ({result['ddp']['params'] / 1e6:.2f} M params, bucket 1 MB, "
        f"{per_step} recorded collectives per step), "
        f"{steps_n} interleaved steps:",
        f"  step wall: plain {statistics.median(steps['plain']):.1f} ms   "
        f"recorded {statistics.median(steps['rec']):.1f} ms   ratio {ratio(steps):.3f}",
        f"  step CPU:  plain {statistics.median(step_cpu['plain']):.1f} ms   "
        f"recorded {statistics.median(step_cpu['rec']):.1f} ms   ratio {ratio(step_cpu):.3f}",
    ]
    split = result.get("split")
    if split:
        cpu_us, n = split["cpu"], max(1, split["collectives"])
        wrapper = _median_delta(cpu_us["off"], cpu_us["plain"])
        recording = _median_delta(cpu_us["on"], cpu_us["off"])
        lines += [
            f"where a DDP step's extra CPU goes: the same stack in {SPLIT_BUCKET_MB:g} MB "
            f"buckets ({split['collectives']} recorded collectives per step), "
            f"{len(cpu_us['on'])} steps of each kind rotating:",
            f"  step CPU plain {statistics.median(cpu_us['plain']) / 1e3:.1f} ms; "
            f"the wrapper (recording off) {wrapper:+.0f} us per step "
            f"({wrapper / n:+.1f} per collective); recording {recording:+.0f} us per step "
            f"({recording / n:+.1f} per collective)",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures; ``--quick`` for a smaller run."""
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)
    deadline = time.monotonic() + HARD_TIMEOUT_S
    with tempfile.TemporaryDirectory(prefix="dl2-bench-") as tmp:
        out = Path(tmp) / "result.json"
        env = dict(os.environ)
        env.update(
            OMP_NUM_THREADS="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
            WORLD_SIZE=str(WORLD),
            BENCH_RUN_DIR=str(Path(tmp) / "run"),
            PYTHONPATH=os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]),
            PYTHONWARNINGS="ignore",
            DL2_BENCH_QUICK="1" if quick else "0",
        )
        env.pop("DL2_RUN_DIR", None)
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--rank", str(out)],
                env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                start_new_session=True,
            )
            for r in range(WORLD)
        ]
        try:
            for proc in procs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"benchmark timed out after {HARD_TIMEOUT_S} s", file=sys.stderr)
            return 1
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        if any(p.returncode != 0 for p in procs) or not out.exists():
            print("benchmark failed", file=sys.stderr)
            return 1
        print(report(json.loads(out.read_text())))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2])
    else:
        sys.exit(main())
