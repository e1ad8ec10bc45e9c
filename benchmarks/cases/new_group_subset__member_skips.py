# dl2-case: label=deadlock world=2 category=new-group-subset
# dl2-expect: ranks=0,1
"""new_group([0, 1]) is called by rank 0 only.

Rank 0 waits inside new_group for member rank 1 to join the group; rank 1 has
skipped it and waits in the barrier for rank 0. (Rank 0 never reaches the
all_reduce on the group.)
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    if rank == 0:
        pair = dist.new_group([0, 1])  # dl2: culprit
        dist.all_reduce(t, group=pair)
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
