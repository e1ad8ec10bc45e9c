"""A 2-rank job of many small ops (blocking and async all_reduce, isend/irecv pairs),
enough to fill several tiny trace segments; with ROTATE_DEADLOCK=1 both ranks then
send to each other first (a deadlock), else they end cleanly."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
peer = 1 - rank
t = torch.ones(4)
for i in range(300):
    dist.all_reduce(t)  # mark: loop
    if i % 10 == 0:
        dist.all_reduce(t, async_op=True).wait()
        works = [dist.isend(t, peer), dist.irecv(torch.empty(4), peer)]
        for work in works:
            work.wait()
if os.environ.get("ROTATE_DEADLOCK") == "1":
    dist.send(t, peer)  # mark: deadlock
dist.barrier()
dist.destroy_process_group()
