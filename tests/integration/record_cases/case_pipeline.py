"""A 2-stage pipeline (GPipe order), gloo: MICRO microbatches sent forward with send and
their gradients sent back; no dl2 code (argv: MICRO)."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
stage = torch.nn.Linear(8, 8)
micro = int(sys.argv[1])
if rank == 0:
    outs = []
    for _ in range(micro):
        out = stage(torch.randn(2, 8))
        dist.send(out.detach(), 1)  # mark: send activation
        outs.append(out)
    for out in outs:
        grad = torch.empty(2, 8)
        dist.recv(grad, 1)  # mark: recv gradient
        out.backward(grad)
else:
    inputs = []
    for _ in range(micro):
        act = torch.empty(2, 8)
        dist.recv(act, 0)  # mark: recv activation
        inputs.append(act.requires_grad_())
    for act in inputs:
        stage(act).square().mean().backward()
        dist.send(act.grad, 0)  # mark: send gradient
dist.destroy_process_group()
