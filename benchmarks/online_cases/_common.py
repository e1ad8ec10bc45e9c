"""What every online-benchmark case shares: set-up, a seeded delay, the block stamp."""

from __future__ import annotations

import os
import random
import time

import torch.distributed as dist


def setup() -> tuple[int, random.Random]:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rng = random.Random(f"{os.environ.get('DL2_BENCH_SEED', '0')}-{rank}")
    return rank, rng


def jitter(rng: random.Random, most: float = 1.0) -> None:
    time.sleep(rng.uniform(0.0, most))


def blocking() -> None:
    """Stamp the moment just before this rank's blocking call."""
    print(f"DL2-BLOCK rank={dist.get_rank()} t={time.time():.6f}", flush=True)
