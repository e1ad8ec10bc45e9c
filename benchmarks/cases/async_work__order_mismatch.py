# dl2-case: label=deadlock world=2 category=async-work
# dl2-expect: ranks=0,1
"""Overlapped communication: both ranks launch an all_reduce of the gradients and a
broadcast of the buffers with async_op=True, then wait for both, but rank 1 launches
them in the opposite order (a dict iterated in a different order)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    grads = torch.ones(4)
    buffers = torch.full((4,), float(rank))
    if rank == 0:
        first = dist.all_reduce(grads, async_op=True)  # dl2: culprit
        second = dist.broadcast(buffers, 0, async_op=True)
    else:
        first = dist.broadcast(buffers, 0, async_op=True)  # dl2: culprit
        second = dist.all_reduce(grads, async_op=True)
    for work in (first, second):
        work.wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
