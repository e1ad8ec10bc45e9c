# dl2-case: label=ok world=4 category=collective-order
"""Correct twin: three steps of sharded data parallel (all_gather_into_tensor of the
parameters, reduce_scatter_tensor of the gradients), same order on every rank."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    shard = torch.full((4,), float(rank))
    for _ in range(3):
        full = torch.empty(4 * world)
        dist.all_gather_into_tensor(full, shard)
        grad = full * 0.5
        grad_shard = torch.empty(4)
        dist.reduce_scatter_tensor(grad_shard, grad)
        shard = shard - 0.01 * grad_shard
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
