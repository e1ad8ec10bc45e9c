# dl2-case: label=deadlock world=2 category=op-mismatch
# dl2-expect: ranks=0,1
"""At the same step rank 0 calls all_reduce and rank 1 all_gather, on tensors of
the same size. gloo does not notice; both ranks wait forever.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    t = torch.full((4,), float(rank))
    if rank == 0:
        dist.all_reduce(t)  # dl2: culprit
    else:
        gathered = [torch.empty(4) for _ in range(world)]
        dist.all_gather(gathered, t)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
