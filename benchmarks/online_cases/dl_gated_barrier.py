# online: world=2 category=gated-barrier
import torch
import torch.distributed as dist
from _common import blocking
from _common import jitter
from _common import setup

rank, rng = setup()
t = torch.ones(4)
jitter(rng)
blocking()
if rank == 0:
    dist.barrier()
dist.all_reduce(t)
