"""Rank 0 receives from any rank, then from rank 2; ranks 1 and 2 send once each.

Rank 2 sends late, so rank 0's wildcard meets rank 1 and the run completes; had it met
rank 2, rank 0 would wait for a second message from rank 2 forever.  ``wildcard.py twin``
receives both messages from any rank, which never depends on the order.
"""

import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    twin = len(sys.argv) > 1 and sys.argv[1] == "twin"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    message = torch.zeros(4)
    if rank == 0:
        dist.recv(message, src=None)
        dist.recv(message, src=None if twin else 2)
    else:
        if rank == 2:
            time.sleep(0.5)  # the clean order: rank 1's message first
        dist.send(message, dst=0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
