# online: world=2 category=wrong-tag
import torch
import torch.distributed as dist
from _common import blocking
from _common import jitter
from _common import setup

rank, rng = setup()
t = torch.ones(8)
jitter(rng)
blocking()
if rank == 0:
    dist.send(t, dst=1, tag=1)
else:
    dist.recv(t, src=0, tag=2)
