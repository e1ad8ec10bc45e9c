# dl2-case: label=deadlock world=2 category=crossed-groups
# dl2-expect: ranks=0,1
"""Two groups with the same members, used in opposite orders.

Rank 0 waits in group A's all_reduce for rank 1, which waits in group B's
all_reduce for rank 0. Each group on its own is consistent; the cycle only
appears across groups.
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
    else:
        dist.all_reduce(b, group=group_b)  # dl2: culprit
        dist.all_reduce(a, group=group_a)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
