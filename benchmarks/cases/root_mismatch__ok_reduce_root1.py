# dl2-case: label=ok world=2 category=root-mismatch
"""Correct twin: every rank reduces to rank 1 (a non-zero root)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.full((4,), float(rank + 1))
    dist.reduce(t, dst=1)
    if rank == 1:
        assert t.tolist() == [3.0] * 4, t
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
