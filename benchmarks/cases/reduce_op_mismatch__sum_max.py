# dl2-case: label=defect world=2 category=reduce-op-mismatch
# dl2-expect: ranks=0,1
"""Rank 0 all_reduces with SUM, rank 1 with MAX.

gloo completes without error, but the result is neither the sum nor the max:
each rank reduces its own chunk of the ring with its own operator.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.tensor([1.0, 2.0, 3.0, 4.0]) * (rank + 1)
    op = dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX
    dist.all_reduce(t, op=op)  # dl2: culprit
    print(
        f"rank {rank}: all_reduce -> {t.tolist()} (SUM: [3, 6, 9, 12], MAX: [2, 4, 6, 8])",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
