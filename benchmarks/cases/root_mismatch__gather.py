# dl2-case: label=defect world=3 category=root-mismatch
# dl2-expect: ranks=0,2
"""dist.gather where rank 2 names itself as the destination (it was meant to be the
"logging" rank, but ranks 0 and 1 still gather to rank 0). Rank 1's part of the
gather completes and it exits; gloo then fails ranks 0 and 2 with "Connection closed by
peer" instead of leaving them hanging."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    dst = 2 if rank == 2 else 0
    t = torch.full((4,), float(rank))
    bucket = [torch.empty(4) for _ in range(world)] if rank == dst else None
    dist.gather(t, bucket, dst=dst)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
