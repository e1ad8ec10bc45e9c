# dl2-case: label=ok world=3 category=rank0-only
"""Correct twin: rank 0 alone writes the checkpoint (no communication inside); every
rank then meets in a barrier before rank 1 and 2 read it."""

import os
import tempfile

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stamp = torch.tensor([os.getpid()]) if rank == 0 else torch.empty(1, dtype=torch.int64)
    dist.broadcast(stamp, src=0)
    path = os.path.join(tempfile.gettempdir(), f"dl2-bench-ckpt-{int(stamp.item())}.pt")
    w = torch.zeros(4)
    for step in range(3):
        grad = torch.ones(4)
        dist.all_reduce(grad)
        w -= 0.1 * grad
        if step == 1:
            if rank == 0:
                torch.save({"w": w}, path)
            dist.barrier()
            assert torch.equal(torch.load(path)["w"], w)
    dist.barrier()
    if rank == 0:
        os.remove(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
