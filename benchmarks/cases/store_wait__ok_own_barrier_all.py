# dl2-case: label=ok world=2 category=store-wait
"""Correct twin: every rank enters the hand-written store barrier (``store.add`` to
count arrivals, the last one sets "go", ``store.wait`` for it), on a store of its own."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def store_barrier(store, name, world_size):
    arrived = store.add(f"{name}/arrived", 1)
    if arrived == world_size:
        store.set(f"{name}/go", "1")
    store.wait([f"{name}/go"])


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # a store of the job's own: rank 0 serves it on a free port, which it announces
    # in the default store
    default = dist.distributed_c10d._get_default_store()
    addr, timeout = os.environ["MASTER_ADDR"], timedelta(seconds=60)
    if rank == 0:
        own = dist.TCPStore(addr, 0, world, True, timeout, wait_for_workers=False)
        default.set("sync_port", str(own.port))
    else:
        own = dist.TCPStore(addr, int(default.get("sync_port")), world, False, timeout)
    store = dist.PrefixStore("sync", own)
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        torch.save(t, "/dev/null")  # the checkpoint
    store_barrier(store, "ckpt", world)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), 4.0)), t
    dist.barrier()  # rank 0 hosts the store: nobody leaves while others may use it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
