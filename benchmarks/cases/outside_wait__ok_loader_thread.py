# dl2-case: label=ok world=3 category=outside-wait interrupt=25
"""Correct twin: rank 0's loader thread fills the queue; the broadcast completes."""

import queue
import threading

import torch
import torch.distributed as dist


def load_shard(rank, out):
    shards = {0: "root", 1: "a", 2: "b"}
    out.put(torch.full((8,), float(len(shards[rank]))))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    batches = queue.Queue()
    threading.Thread(target=load_shard, args=(rank, batches), daemon=True).start()
    batch = batches.get() if rank == 0 else torch.empty(8)
    dist.broadcast(batch, src=0)
    assert batch.eq(4.0).all(), batch
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
