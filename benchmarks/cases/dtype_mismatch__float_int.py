# dl2-case: label=defect world=2 category=dtype-mismatch
# dl2-expect: ranks=0,1
"""Rank 0 all_reduces float32, rank 1 int32, same element count (same bytes).

gloo completes without error; the bytes are combined as if they had the
receiver's type, so both results are wrong (rank 1 gets the float's bit pattern).
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dtype = torch.float32 if rank == 0 else torch.int32
    t = torch.ones(4, dtype=dtype)
    dist.all_reduce(t)  # dl2: culprit
    print(f"rank {rank}: all_reduce -> {t.tolist()} (expected [2, 2, 2, 2])", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
