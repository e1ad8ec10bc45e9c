"""Two ranks that deadlock on purpose: rank 0 waits on an irecv from 1, rank 1 blocks in a
recv from 0.  The test kills both with SIGKILL once the watchdog has seen them stuck."""

from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
dist.all_reduce(torch.ones(2))
buf = torch.zeros(2)
if rank == 0:
    req = dist.irecv(buf, src=1)
    req.wait()  # mark: rank0_wait
else:
    dist.recv(buf, src=0)  # mark: rank1_recv
