# dl2-case: label=deadlock world=3 category=wildcard nondeterministic=1
# dl2-expect: ranks=0,1,2
"""A parameter server takes the first update from anyone (recv(src=None)) and then one
more specifically from rank 1. When rank 1's update wins the wildcard (both workers send
after a random pause), the named recv waits forever for a second message from rank 1
while rank 2's send is never received and rank 1 waits in the final barrier: a hang. When rank 2 wins, the run completes.
Labelled by what can happen (deadlock); plain gloo hung in part of the runs (README)."""

import random
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    buf = torch.empty(4)
    if rank == 0:
        dist.recv(buf)
        dist.recv(buf, src=1)  # dl2: culprit
    else:
        time.sleep(random.random() * 0.2)
        dist.send(torch.full((4,), float(rank)), dst=0)
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
