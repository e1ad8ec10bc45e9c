# dl2-case: label=ok world=3 category=nonmember-call
"""Correct subgroup use: every rank creates the group, only its members use it."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair = dist.new_group([0, 1])
    t = torch.full((4,), float(rank))
    if rank in (0, 1):
        dist.all_reduce(t, group=pair)
        assert torch.equal(t, torch.ones(4)), t
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
