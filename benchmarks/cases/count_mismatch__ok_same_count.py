# dl2-case: label=ok world=2 category=count-mismatch
"""Correct twin: both ranks all_reduce 8 elements."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    t = torch.ones(8)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((8,), 2.0)), t
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
