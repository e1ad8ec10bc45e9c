# online: world=3 category=recv-recv-ring
import torch
import torch.distributed as dist
from _common import blocking
from _common import jitter
from _common import setup

rank, rng = setup()
world = dist.get_world_size()
jitter(rng)
blocking()
dist.recv(torch.empty(8), src=(rank - 1) % world)
