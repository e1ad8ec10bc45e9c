# dl2-case: label=ok world=2 category=root-mismatch
"""Correct twin: both ranks broadcast from root 0."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.full((4,), float(rank))
    dist.broadcast(t, src=0)
    assert torch.equal(t, torch.zeros(4)), t
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
