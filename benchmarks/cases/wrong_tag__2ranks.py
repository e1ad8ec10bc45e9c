# dl2-case: label=deadlock world=2 category=wrong-tag
# dl2-expect: ranks=0,1
"""Rank 0 sends with one tag, rank 1 receives with another.

gloo matches point-to-point messages on (peer, tag): the send and the receive
never match, and both ranks wait forever.
"""

import torch
import torch.distributed as dist

GRAD_TAG = 1
ACT_TAG = 2


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    buf = torch.full((4,), float(rank))
    if rank == 0:
        dist.send(buf, dst=1, tag=GRAD_TAG)  # dl2: culprit
    else:
        dist.recv(buf, src=0, tag=ACT_TAG)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
