# dl2-case: label=ok world=3 category=async-work
"""Correct twin: rank 0 posts irecv from ranks 1 and 2 and waits for them in the order
opposite to the order the senders (delayed) deliver them."""

import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        bufs = {src: torch.empty(4) for src in (1, 2)}
        works = {src: dist.irecv(bufs[src], src=src) for src in (1, 2)}
        works[2].wait()
        works[1].wait()
        assert bufs[1][0].item() == 1.0 and bufs[2][0].item() == 2.0
    else:
        time.sleep(0.5 if rank == 2 else 0.0)
        dist.send(torch.full((4,), float(rank)), dst=0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
