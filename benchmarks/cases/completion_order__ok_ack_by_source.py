# dl2-case: label=ok world=3 category=completion-order
"""Correct twin: rank 0 still receives on two threads in whatever order the messages
complete, but it acknowledges rank 1 (the only rank that waits for one) by name."""

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
        assert sorted(done) == [1, 2]
        dist.send(torch.ones(1), dst=1)
    else:
        time.sleep(random.random() * 0.2)
        dist.send(torch.full((4,), float(rank)), dst=0)
        if rank == 1:
            dist.recv(torch.empty(1), src=0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
