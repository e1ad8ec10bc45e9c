# dl2-case: label=defect world=2 category=collective-skipped
# dl2-expect: ranks=0,1
"""Rank 1 exits the process before the last all_reduce.

Plain gloo does not hang here: when rank 1's process ends its sockets close and
rank 0's pending all_reduce raises "Connection closed by peer", so the job
crashes (rank 0 exits 1, rank 1 exits 0).
"""

import sys

import torch
import torch.distributed as dist

STEPS = 3


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    for step in range(STEPS):
        if rank == 1 and step == STEPS - 1:
            sys.exit(0)  # rank-local early exit
        dist.all_reduce(t)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
