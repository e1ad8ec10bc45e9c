# dl2-case: label=defect world=2 category=count-mismatch
# dl2-expect: ranks=0,1
"""Rank 0 all_reduces 4 elements, rank 1 8 elements.

Plain gloo does not hang: a rank receives more bytes than it expects, gloo's
transport thread fails an enforce ("Received data size doesn't match expected
size") and the process aborts (SIGABRT); the other rank then fails with
"Connection reset by peer".
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    count = 4 if rank == 0 else 8
    t = torch.ones(count)
    dist.all_reduce(t)  # dl2: culprit
    print(f"rank {rank}: all_reduce -> {t.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
