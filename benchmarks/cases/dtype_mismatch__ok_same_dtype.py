# dl2-case: label=ok world=2 category=dtype-mismatch
"""Correct twin: both ranks all_reduce int32."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    t = torch.ones(4, dtype=torch.int32)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), 2, dtype=torch.int32)), t
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
