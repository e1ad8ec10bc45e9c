"""Gradient fusion driven by each rank's own timing: a nondeterministic communication bug.

Plain PyTorch, no dl2 API.  Each step, every rank computes the gradients of K tensors;
tensor ``i`` becomes ready after about ``i * gap`` plus a random per-rank delay (the
rank's own timing: kernels, data, the OS).  Tensors are fused *in the order they become
ready* into buckets of at most F tensors (``--fusion-count``) or B bytes
(``--fusion-bytes``; a tensor larger than B goes alone), and each bucket is all-reduced
as soon as it is closed:

* ``--mode coalesced`` (default): ``all_reduce_coalesced(bucket)`` (gloo flattens the
  tensors itself).  dl2 records the element count of each fused tensor, which is what
  lets ``dl2 predict --fusion`` see the other fusions the same tensors allow;
* ``--mode flatten``: ``torch.cat`` -> ``all_reduce`` -> copy back, as hand-written
  fusion does; dl2 then sees only each bucket's total.

Inside a bucket the tensors are laid out in index order.  When two ranks' ready orders
put different tensors into a bucket, the job breaks: bucket sizes differ (gloo aborts
the process on the size mismatch), the bucket counts differ (the rank with more buckets
hangs in its extra collective), or, same size, the sums mix unrelated tensors (the
self-check below fails with exit status 5).  With one bucket (F >= K and B >= the total)
no order can break it.

    dl2 run -n 2 benchmarks/workloads_nd/fusion.py --fusion-count 2 --seed 7
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import warnings
from collections.abc import Sequence

#: elements (float32) of each gradient tensor: 256 bytes to 1 MiB, 1.35 MiB in all
SIZES = (64, 256, 1024, 4096, 16384, 65536, 262144, 2048)
ITEMSIZE = 4
#: exit status of a wrong reduction (ranks fused different tensors of the same size)
WRONG_RESULT = 5


def buckets(
    order: Sequence[int], nbytes: Sequence[int], fusion_count: int, fusion_bytes: int
) -> list[list[int]]:
    """The buckets a rank forms from tensors ready in ``order``: greedy, at most
    ``fusion_count`` tensors or ``fusion_bytes`` bytes (a larger tensor alone)."""
    out: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index in order:
        if current and (len(current) >= fusion_count or size + nbytes[index] > fusion_bytes):
            out.append(current)
            current, size = [], 0
        current.append(index)
        size += nbytes[index]
    if current:
        out.append(current)
    return out


def ready_order(
    rng: random.Random, k: int, gap_ms: float, jitter_ms: float
) -> list[tuple[float, int]]:
    """(ready time in seconds, tensor) in ready order."""
    times = [(i * gap_ms + rng.uniform(0.0, jitter_ms)) / 1000.0 for i in range(k)]
    return sorted((t, i) for i, t in enumerate(times))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fusion-count", type=int, default=2, metavar="F")
    parser.add_argument("--fusion-bytes", type=int, default=1 << 30, metavar="B")
    parser.add_argument("--mode", choices=("coalesced", "flatten"), default="coalesced")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gap-ms", type=float, default=1.0)
    parser.add_argument("--jitter-ms", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    args = parse(argv)
    warnings.filterwarnings("ignore", message=".*all_reduce_coalesced.*", category=FutureWarning)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    nbytes = [n * ITEMSIZE for n in SIZES]
    grads = [torch.zeros(n) for n in SIZES]
    expected = world * (world + 1) / 2
    for step in range(args.steps):
        rng = random.Random(args.seed * 1_000_003 + step * 1009 + rank)
        for i, grad in enumerate(grads):
            grad.fill_((rank + 1) * (i + 1))  # "backward" of tensor i
        pending: list[int] = []
        start = time.monotonic()
        schedule = ready_order(rng, len(SIZES), args.gap_ms, args.jitter_ms)
        for ready_at, index in schedule:
            time.sleep(max(0.0, start + ready_at - time.monotonic()))
            # Tensor `index` is ready: close the open bucket if it cannot take it.
            closed = buckets([*pending, index], nbytes, args.fusion_count, args.fusion_bytes)
            if len(closed) > 1:
                reduce_bucket(closed[0], grads, args.mode)
                pending = closed[1]
            else:
                pending = closed[0]
        if pending:
            reduce_bucket(pending, grads, args.mode)
        for i, grad in enumerate(grads):
            if not torch.all(grad == expected * (i + 1)):
                print(f"rank {rank}: step {step}: tensor {i} reduced wrongly", file=sys.stderr)
                dist.destroy_process_group()
                return WRONG_RESULT
    dist.destroy_process_group()
    return 0


def reduce_bucket(bucket: list[int], grads: list[object], mode: str) -> None:
    """All-reduce the bucket's tensors (laid out in index order) in one collective."""
    import torch
    import torch.distributed as dist

    tensors = [grads[i] for i in sorted(bucket)]
    if mode == "coalesced":
        dist.all_reduce_coalesced(tensors)  # type: ignore[arg-type]
        return
    flat = torch.cat([t.view(-1) for t in tensors])  # type: ignore[attr-defined]
    dist.all_reduce(flat)
    offset = 0
    for t in tensors:
        n = t.numel()  # type: ignore[attr-defined]
        t.copy_(flat[offset : offset + n].view_as(t))  # type: ignore[attr-defined]
        offset += n


if __name__ == "__main__":
    sys.exit(main())
