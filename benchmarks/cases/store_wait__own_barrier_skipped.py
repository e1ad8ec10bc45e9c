# dl2-case: label=deadlock world=2 category=store-wait
# dl2-expect: ranks=0,1
"""A hand-written store barrier that one rank skips.

``store_barrier`` counts arrivals with ``store.add``; the last rank to arrive sets the
"go" key every rank waits for. Only rank 0 saves a checkpoint and enters the barrier
behind it; rank 1 goes on to the next all_reduce. Rank 0 waits for "go", which only a
second arrival would set, while rank 1 waits for rank 0 in the all_reduce.
"""

import torch
import torch.distributed as dist


def store_barrier(store, name, world_size):
    arrived = store.add(f"{name}/arrived", 1)
    if arrived == world_size:
        store.set(f"{name}/go", "1")
    store.wait([f"{name}/go"])  # dl2: culprit


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        torch.save(t, "/dev/null")  # the checkpoint
        store_barrier(store, "ckpt", world)
    dist.all_reduce(t)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
