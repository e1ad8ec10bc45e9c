# online: world=2 category=send-send
import torch
import torch.distributed as dist
from _common import blocking
from _common import jitter
from _common import setup

rank, rng = setup()
jitter(rng)
blocking()
dist.send(torch.ones(8), dst=1 - rank)
