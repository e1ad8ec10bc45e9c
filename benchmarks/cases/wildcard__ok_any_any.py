# dl2-case: label=ok world=3 category=wildcard
"""Correct twin: the server takes two updates from anyone (both receives are wildcards),
so either arrival order completes."""

import random
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    buf = torch.empty(4)
    if rank == 0:
        senders = {dist.recv(buf), dist.recv(buf)}
        assert senders == {1, 2}, senders
    else:
        time.sleep(random.random() * 0.2)
        dist.send(torch.full((4,), float(rank)), dst=0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
