# dl2-case: label=ok world=2 category=early-stop
"""Correct twin: the stop decision is all_reduced (MAX of the local flags), so every
rank leaves the loop at the same step."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    w = torch.zeros(4)
    for step in range(1, 6):
        grad = torch.full((4,), 0.1 * (rank + 1))
        dist.all_reduce(grad)
        w -= grad
        local_val_loss = 1.0 / (step * (1 + 3 * rank))
        stop = torch.tensor([1.0 if local_val_loss < 0.2 else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
