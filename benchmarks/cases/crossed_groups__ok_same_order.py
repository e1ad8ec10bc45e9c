# dl2-case: label=ok world=3 category=crossed-groups
"""Correct twin: both members use group A then group B; rank 2 only creates them."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group_a = dist.new_group([0, 1])
    group_b = dist.new_group([0, 1])
    a = torch.ones(4)
    b = torch.ones(4)
    if rank in (0, 1):
        dist.all_reduce(a, group=group_a)
        dist.all_reduce(b, group=group_b)
        assert torch.equal(a + b, torch.full((4,), 4.0)), (a, b)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
