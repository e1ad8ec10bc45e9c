"""A gradient exchange that relies on send buffering: both ranks send first.

Two ranks swap K tensors (the sizes of ``fusion.py``), fused F at a time
(``--fusion-count``) into messages: each rank sends all its messages, then receives the
peer's.  It completes only where every message fits the backend's eager buffer (``dl2
run --buffer-size`` emulates one on gloo); a larger message waits for a receive the peer
posts only after its own sends: a deadlock.  Deterministic: whether it deadlocks depends
only on the largest message and the buffer.

    dl2 run --buffer-size 1MiB -n 2 benchmarks/workloads_nd/exchange.py --fusion-count 2
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

SIZES = (64, 256, 1024, 4096, 16384, 65536, 262144, 2048)
ITEMSIZE = 4


def messages(fusion_count: int) -> list[list[int]]:
    """The tensors of each message: consecutive groups of ``fusion_count``."""
    k = len(SIZES)
    return [list(range(i, min(i + fusion_count, k))) for i in range(0, k, fusion_count)]


def largest_message(fusion_count: int) -> int:
    """Bytes of the largest message."""
    return max(sum(SIZES[i] for i in m) * ITEMSIZE for m in messages(fusion_count))


def main(argv: Sequence[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fusion-count", type=int, default=1, metavar="F")
    parser.add_argument("--seed", type=int, default=0, help="unused (every run is the same)")
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    grads = [torch.full((n,), float(rank + 1)) for n in SIZES]
    parts = messages(args.fusion_count)
    for part in parts:
        dist.send(torch.cat([grads[i] for i in part]), dst=peer)  # every rank sends first
    for part in parts:
        incoming = torch.empty(sum(SIZES[i] for i in part))
        dist.recv(incoming, src=peer)
        if not torch.all(incoming == float(peer + 1)):
            print(f"rank {rank}: wrong data from rank {peer}", file=sys.stderr)
            return 5
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
