"""With TORCH_DISTRIBUTED_DEBUG=DETAIL torch checks each collective across the ranks
first and raises at once on a mismatch (here an all_reduce against a broadcast): the
job must fail so under dl2 as well, not hang."""

import os

os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
if dist.get_rank() == 0:
    dist.all_reduce(t)
else:
    dist.broadcast(t, src=0)
dist.destroy_process_group()
