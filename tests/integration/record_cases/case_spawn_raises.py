"""torch.multiprocessing.spawn of 2 workers; worker 1 raises while loading its shard,
between a barrier and an all_reduce.  No dl2 code.  argv: PORT."""

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def load_shard(rank: int) -> torch.Tensor:
    if rank == 1:
        raise ValueError(f"shard {rank} is corrupt")  # mark: raise
    return torch.ones(4)


def worker(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    dist.barrier()
    batch = load_shard(rank)
    dist.all_reduce(batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]),), nprocs=2)
