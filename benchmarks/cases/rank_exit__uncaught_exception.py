# dl2-case: label=defect world=2 category=rank-exit
# dl2-expect: ranks=0,1
"""Rank 1 raises while loading its data shard, between two collectives; rank 0 goes on
to the all_reduce.  Plain gloo does not hang: rank 1's process ends with the
ValueError, its sockets close and rank 0's all_reduce raises "Connection closed by
peer" (both exit 1).  The cause is rank 1's exception, at `load_shard`'s raise."""

import torch
import torch.distributed as dist


def load_shard(rank):
    if rank == 1:
        raise ValueError(f"shard {rank} is corrupt")
    return torch.ones(4)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.barrier()
    batch = load_shard(rank)
    dist.all_reduce(batch)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
