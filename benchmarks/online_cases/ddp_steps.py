# online: world=2 category=cost
"""A small DDP training loop that writes each step's start and end times.

Usage: ddp_steps.py SECONDS OUT_PREFIX.  Runs steps until SECONDS have passed (an
all_reduce of a stop flag each step keeps the ranks in step), then writes
OUT_PREFIX.rank<R>.json: [[start_ns, end_ns], ...] in time.monotonic_ns().
"""

import json
import sys
import time

import torch
import torch.distributed as dist
from _common import setup
from torch import nn
from torch.nn.parallel import DistributedDataParallel

seconds, prefix = float(sys.argv[1]), sys.argv[2]
rank, _ = setup()
torch.manual_seed(0)
model = DistributedDataParallel(
    nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(32, 128)
steps = []
start = time.monotonic()
while True:
    t0 = time.monotonic_ns()
    loss = model(data).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    flag = torch.tensor([1.0 if time.monotonic() - start > seconds else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    steps.append([t0, time.monotonic_ns()])
    if flag.item() > 0:
        break
with open(f"{prefix}.rank{rank}.json", "w") as out:
    json.dump(steps, out)
dist.destroy_process_group()
