# online: world=2 category=crossed-groups
import torch
import torch.distributed as dist
from _common import blocking
from _common import jitter
from _common import setup

rank, rng = setup()
group_a = dist.new_group([0, 1])
group_b = dist.new_group([0, 1])
a, b = torch.ones(4), torch.ones(4)
jitter(rng)
blocking()
if rank == 0:
    dist.all_reduce(a, group=group_a)
    dist.all_reduce(b, group=group_b)
else:
    dist.all_reduce(b, group=group_b)
    dist.all_reduce(a, group=group_a)
