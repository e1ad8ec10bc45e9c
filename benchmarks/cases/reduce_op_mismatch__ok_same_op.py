# dl2-case: label=ok world=2 category=reduce-op-mismatch
"""Correct twin: both ranks all_reduce with MAX."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.tensor([1.0, 2.0, 3.0, 4.0]) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert torch.equal(t, torch.tensor([2.0, 4.0, 6.0, 8.0])), t
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
