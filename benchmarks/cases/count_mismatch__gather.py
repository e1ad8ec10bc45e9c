# dl2-case: label=defect world=3 category=count-mismatch
# dl2-expect: ranks=0,1,2
"""Rank 0 gathers per-rank statistics into slots of 4 values; rank 2 was configured with
one metric fewer and contributes 3.  gloo does not check the sizes of a gather."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stats = torch.full((3 if rank == 2 else 4,), float(rank))
    slots = [torch.zeros(4) for _ in range(3)] if rank == 0 else None
    dist.gather(stats, slots, dst=0)  # dl2: culprit
    if rank == 0:
        print([s.tolist() for s in slots], flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
