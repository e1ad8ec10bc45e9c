# dl2-case: label=defect world=4 category=subgroup-misuse
# dl2-expect: ranks=2,3
"""Tensor-parallel pairs {0, 1} and {2, 3}: rank 3 decides it is done (its shard of the
data ran out) and returns without the pair's all_reduce. Rank 2 waits on it; rank 3's
process exits and gloo raises "Connection closed by peer" in rank 2."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair, _ = dist.new_subgroups(group_size=2)
    t = torch.full((4,), float(rank))
    if rank == 3:
        return
    dist.all_reduce(t, group=pair)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
