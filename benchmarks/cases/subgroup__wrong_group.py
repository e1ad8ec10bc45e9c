# dl2-case: label=deadlock world=4 category=subgroup-misuse
# dl2-expect: ranks=0,1,2,3
"""Two data-parallel replicas {0, 1} and {2, 3} made with new_subgroups; ranks 2 and 3
pass the default group instead of their subgroup to all_reduce. Ranks 0 and 1 finish
their subgroup all_reduce and wait in the world barrier, which ranks 2 and 3 cannot
reach: their world all_reduce waits for 0 and 1."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    subgroup, _ = dist.new_subgroups(group_size=2)
    t = torch.full((4,), float(rank))
    group = subgroup if rank < 2 else None
    dist.all_reduce(t, group=group)  # dl2: culprit
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
