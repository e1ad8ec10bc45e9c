# dl2-case: label=deadlock world=3 category=completion-order nondeterministic=1
# dl2-expect: ranks=0,1,2
"""Rank 0 receives from ranks 1 and 2 on two threads (one blocking recv each) and
acknowledges whichever message completed first. Only rank 1 waits for an
acknowledgement (rank 2 goes straight to the barrier). When rank 2's message completes
first, rank 0's send to rank 2 can never be received: a hang; when rank 1's does, the
run completes. Labelled by what can happen (deadlock)."""

import random
import threading
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        done = []

        def take(src):
            dist.recv(torch.empty(4), src=src)
            done.append(src)

        threads = [threading.Thread(target=take, args=(src,)) for src in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        dist.send(torch.ones(1), dst=done[0])  # dl2: culprit
    else:
        time.sleep(random.random() * 0.2)
        dist.send(torch.full((4,), float(rank)), dst=0)
        if rank == 1:
            dist.recv(torch.empty(1), src=0)
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
