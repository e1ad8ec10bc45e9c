# dl2-case: label=ok world=3 category=new-group-subset
"""Correct twin: every rank calls new_group; only members use the group."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        dist.all_reduce(t, group=pair)
        assert torch.equal(t, torch.full((4,), 2.0)), t
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
