# online: world=2 category=object-collective-subset
import torch.distributed as dist
from _common import blocking
from _common import jitter
from _common import setup

rank, rng = setup()
gathered = [None] * dist.get_world_size()
jitter(rng)
blocking()
if rank == 0:
    dist.all_gather_object(gathered, {"rank": rank})
dist.barrier()
