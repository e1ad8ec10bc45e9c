# dl2-case: label=deadlock world=3 category=outside-wait interrupt=25
# dl2-expect: ranks=0,1,2
"""Rank 0, the root of the broadcast, waits on a queue its loader thread never fills.

The loader thread of rank 0 dies on an exception (a missing shard) that only prints a
traceback; rank 0's main thread then waits on ``queue.get()`` forever, outside
torch.distributed, while ranks 1 and 2 wait in the broadcast from rank 0.  Nothing in
the job fails: it hangs until someone stops it (this case is interrupted after 25 s, as
a user at the terminal would).  dl2's verdict: ``hang``, naming the broadcast of ranks 1
and 2 and rank 0's line.
"""

import queue
import threading

import torch
import torch.distributed as dist


def load_shard(rank, out):
    shards = {1: "a", 2: "b"}  # rank 0's shard is missing
    out.put(torch.full((8,), float(len(shards[rank]))))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    batches = queue.Queue()
    threading.Thread(target=load_shard, args=(rank, batches), daemon=True).start()
    if rank == 0:
        batch = batches.get()  # waits forever: the loader thread died
    else:
        batch = torch.empty(8)
    dist.broadcast(batch, src=0)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
