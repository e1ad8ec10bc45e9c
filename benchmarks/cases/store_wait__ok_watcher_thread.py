# dl2-case: label=ok world=2 category=store-wait
"""Correct: a watcher thread waits in ``store.wait`` for a "stop" key for the whole run
while the main thread trains; rank 0 sets the key at the end.

Rank 0's steps are slow, so rank 1 waits for it in each all_reduce while rank 0's
watcher sits in the store wait: rank 0 is computing, not blocked, and nothing is stuck.
The watcher has a store client of its own: a TCPStore client serves one call at a
time, so a set from the main thread would queue behind the watcher's wait forever.
"""

import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def client():  # another connection to the job's store server (rank 0's)
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        return dist.TCPStore(addr, port, world, False, timedelta(seconds=60))

    store, watched = client(), client()
    watcher = threading.Thread(target=watched.wait, args=(["stop"],))
    watcher.start()
    t = torch.ones(4)
    for _ in range(3):
        if rank == 0:
            time.sleep(1.0)  # a slow step
        dist.all_reduce(t)
    if rank == 0:
        store.set("stop", "1")
    watcher.join()
    assert torch.equal(t, torch.full((4,), 8.0)), t
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
