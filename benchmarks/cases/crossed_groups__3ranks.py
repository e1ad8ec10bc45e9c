# dl2-case: label=deadlock world=3 category=crossed-groups
# dl2-expect: ranks=0,1
"""Two subgroups {0, 1} of a three-rank world, used in opposite orders by ranks
0 and 1. Rank 2 creates both groups (new_group must be called by every rank),
uses neither and exits normally; that does not disturb ranks 0 and 1, which
stay blocked.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group_a = dist.new_group([0, 1])
    group_b = dist.new_group([0, 1])
    a = torch.ones(4)
    b = torch.ones(4)
    if rank == 0:
        dist.all_reduce(a, group=group_a)  # dl2: culprit
        dist.all_reduce(b, group=group_b)
    elif rank == 1:
        dist.all_reduce(b, group=group_b)  # dl2: culprit
        dist.all_reduce(a, group=group_a)


if __name__ == "__main__":
    main()
