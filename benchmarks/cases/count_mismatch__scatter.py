# dl2-case: label=defect world=2 category=count-mismatch
# dl2-expect: ranks=0,1
"""Rank 0 scatters shards of 6 values; rank 1 sized its receive buffer from a stale
shard size of 4."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    shard = torch.zeros(6 if rank == 0 else 4)
    shards = [torch.full((6,), float(r)) for r in range(2)] if rank == 0 else None
    dist.scatter(shard, shards, src=0)  # dl2: culprit
    print(f"rank {rank}: {shard.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
