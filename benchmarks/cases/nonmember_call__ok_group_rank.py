# dl2-case: label=ok world=4 category=nonmember-call
"""Correct twin: a broadcast on group {2, 3} from global rank 2, issued only by the
members (with the group's source given as a global rank), and a world all_reduce."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g01 = dist.new_group([0, 1])
    g23 = dist.new_group([2, 3])
    t = torch.full((4,), float(rank))
    if rank in (2, 3):
        dist.broadcast(t, src=2, group=g23)
        assert t[0].item() == 2.0
    else:
        dist.broadcast(t, src=0, group=g01)
        assert t[0].item() == 0.0
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
