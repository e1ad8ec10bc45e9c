# dl2-case: label=defect world=2 category=rank-exit
# dl2-expect: ranks=0,1
"""Rank 1 exits right after init while rank 0 waits to receive from it.

Plain gloo does not hang: when rank 1's process ends its sockets close and
rank 0's recv raises "Connection closed by peer" (rank 0 exits 1).
"""

import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 1:
        sys.exit(0)
    t = torch.empty(4)
    dist.recv(t, src=1)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
