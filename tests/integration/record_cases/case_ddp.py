"""DDP on a tiny model, 2 ranks, gloo: STEPS training steps; no dl2 code (argv: STEPS)."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    x = torch.randn(4, 8)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()  # mark: backward
    opt.step()
dist.destroy_process_group()
