# dl2-case: label=ok world=3 category=random-order
"""Correct twin: the number of steps and the order of two differently sized all_reduces
per step are random, but rank 0 draws the seed and broadcasts it, so every rank draws
the same sequence."""

import random

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    seed = torch.tensor([random.SystemRandom().randrange(2**31) if rank == 0 else 0])
    dist.broadcast(seed, src=0)
    rng = random.Random(int(seed.item()))
    for _ in range(rng.choice([2, 3, 4])):
        sizes = [4, 12]
        rng.shuffle(sizes)
        for size in sizes:
            dist.all_reduce(torch.ones(size))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
