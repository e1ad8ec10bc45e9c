# dl2-case: label=deadlock world=2 category=async-work
# dl2-expect: ranks=0,1
"""Rank 0 launches an async all_reduce of a logging metric inside `if rank == 0` and
waits for it at the end of the step; rank 1 never launches it and waits in the barrier
that ends the step."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    metric = torch.tensor([float(rank)])
    work = None
    if rank == 0:
        work = dist.all_reduce(metric, async_op=True)  # dl2: culprit
    if work is not None:
        work.wait()
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
