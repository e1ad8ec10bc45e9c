"""multiprocessing.Process workers (fork, Python's default on Linux) that never call
destroy_process_group; with argv[2] == "raise", worker 1 raises while loading its shard."""

import multiprocessing
import sys

import torch
import torch.distributed as dist


def load_shard(rank, fail):
    if fail and rank == 1:
        raise ValueError(f"shard {rank} is corrupt")  # mark: raise
    return torch.ones(4)


def worker(rank, port, fail):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    dist.barrier()
    batch = load_shard(rank, fail)
    dist.all_reduce(batch)


if __name__ == "__main__":
    port, fail = int(sys.argv[1]), sys.argv[2] == "raise"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=worker, args=(r, port, fail)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    sys.exit(max(p.exitcode or 0 for p in procs))
