# online: world=2 category=collective-order
import torch
import torch.distributed as dist
from _common import blocking
from _common import jitter
from _common import setup

rank, rng = setup()
t = torch.ones(4)
dist.all_reduce(t)
jitter(rng)
blocking()
if rank == 0:
    dist.all_reduce(t)
else:
    dist.broadcast(t, src=0)
