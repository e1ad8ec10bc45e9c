# dl2-case: label=ok world=2 category=rank-exit
"""Correct twin: rank 1 sends its tensor before it exits."""

import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.full((4,), 7.0)
    if rank == 1:
        dist.send(t, dst=0)
        sys.exit(0)
    t = torch.empty(4)
    dist.recv(t, src=1)
    assert torch.equal(t, torch.full((4,), 7.0)), t
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
