# dl2-case: label=ok world=2 category=collective-order
"""Correct: the same collectives, in the same order, issued from different call
sites on different ranks (rank 0 from reduce_grads(), rank 1 from reduce_metrics()).
Only the sequence of operations per group matters, not where they are called from.
"""

import torch
import torch.distributed as dist


def reduce_grads(t):
    dist.all_reduce(t)
    dist.broadcast(t, src=0)


def reduce_metrics(t):
    dist.all_reduce(t)
    dist.broadcast(t, src=0)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.full((4,), float(rank + 1))
    if rank == 0:
        reduce_grads(t)
    else:
        reduce_metrics(t)
    assert torch.equal(t, torch.full((4,), 3.0)), t
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
