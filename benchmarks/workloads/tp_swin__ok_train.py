# dl2-case: label=ok world=2 category=tensor-parallel
"""Tensor parallelism (DTensor, parallelize_module) on a tiny Swin classifier: every MLP
is split Megatron-style (fc1 column-wise, fc2 row-wise); all ranks see the same batch.
20 steps by default."""

import _common
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel
from torch.distributed.tensor.parallel import RowwiseParallel
from torch.distributed.tensor.parallel import parallelize_module


def main():
    _, world = _common.init()
    mesh = init_device_mesh("cpu", (world,))
    model = _common.swin()
    for stage in model.swin.encoder.layers:
        for block in stage.blocks:
            parallelize_module(
                block.mlp, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
            )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    log = _common.StepLog()
    for step in range(_common.steps(20)):
        with log.step():
            pixels, labels = _common.images(step)
            loss = model(pixel_values=pixels, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    log.save()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
