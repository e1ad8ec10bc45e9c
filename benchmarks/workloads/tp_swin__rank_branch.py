# dl2-case: label=defect world=2 category=tensor-parallel
# dl2-expect: ranks=0,1
"""Tensor-parallel Swin (as tp_swin__ok_train) with an activation monitor added to the
first MLP: on rank 0 only (the logging rank) it all_reduces the activation norm, inside
the model's forward. That all_reduce meets rank 1's row-parallel all_reduce of fc2."""

import _common
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel
from torch.distributed.tensor.parallel import RowwiseParallel
from torch.distributed.tensor.parallel import parallelize_module


class Monitored(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        if dist.get_rank() == 0:
            norm = x.detach().norm().reshape(1)
            dist.all_reduce(norm)  # dl2: culprit
        return self.inner(x)  # dl2: culprit (rank 1's fc2 all_reduce is issued inside)


def main():
    _, world = _common.init()
    mesh = init_device_mesh("cpu", (world,))
    model = _common.swin()
    for stage in model.swin.encoder.layers:
        for block in stage.blocks:
            parallelize_module(
                block.mlp, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
            )
    first = model.swin.encoder.layers[0].blocks[0]
    first.mlp = Monitored(first.mlp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(_common.steps(6)):
        pixels, labels = _common.images(step)
        loss = model(pixel_values=pixels, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
