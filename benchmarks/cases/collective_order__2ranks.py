# dl2-case: label=deadlock world=2 category=collective-order
# dl2-expect: ranks=0,1
"""Rank 0 issues all_reduce then broadcast, rank 1 broadcast then all_reduce.

The first collective of the default group differs between the ranks; under
gloo both ranks wait in their first collective forever.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    grads = torch.full((4,), float(rank))
    params = torch.full((4,), float(rank))
    if rank == 0:
        dist.all_reduce(grads)  # dl2: culprit
        dist.broadcast(params, src=0)
    else:
        dist.broadcast(params, src=0)  # dl2: culprit
        dist.all_reduce(grads)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
