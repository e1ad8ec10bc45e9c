# dl2-case: label=deadlock world=2 category=collective-order
# dl2-expect: ranks=0,1
"""Hand-written sharded data parallel: rank 0 all-gathers the parameters before the
forward, rank 1 first reduce-scatters last step's gradients (the two phases in opposite
orders). Both tensors are 8 floats on each rank."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    shard = torch.full((4,), float(rank))
    full = torch.empty(8)
    grad = torch.ones(8)
    grad_shard = torch.empty(4)
    if rank == 0:
        dist.all_gather_into_tensor(full, shard)  # dl2: culprit
        dist.reduce_scatter_tensor(grad_shard, grad)
    else:
        dist.reduce_scatter_tensor(grad_shard, grad)  # dl2: culprit
        dist.all_gather_into_tensor(full, shard)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
