# dl2-case: label=deadlock world=3 category=rank0-only
# dl2-expect: ranks=0,1,2
"""save_checkpoint() is called under `if rank == 0`, but it ends with a barrier ("make
sure the file is written before anyone reads it"). Ranks 1 and 2 go on to the next
step's all_reduce."""

import os
import tempfile

import torch
import torch.distributed as dist


def save_checkpoint(state, path):
    torch.save(state, path)
    dist.barrier()  # dl2: culprit


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    w = torch.zeros(4)
    path = os.path.join(tempfile.gettempdir(), f"dl2-bench-ckpt-{os.getpid()}.pt")
    for step in range(3):
        grad = torch.ones(4)
        dist.all_reduce(grad)  # dl2: culprit
        w -= 0.1 * grad
        if step == 1 and rank == 0:
            save_checkpoint({"w": w}, path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
