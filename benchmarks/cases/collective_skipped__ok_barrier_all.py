# dl2-case: label=ok world=2 category=collective-skipped
"""Correct twin: every rank runs every step and enters the barrier."""

import torch
import torch.distributed as dist

STEPS = 3


def main():
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for _ in range(STEPS):
        dist.all_reduce(t)
    dist.barrier()
    assert torch.equal(t, torch.full((4,), 8.0)), t
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
