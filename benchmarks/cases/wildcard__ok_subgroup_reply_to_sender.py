# dl2-case: label=ok world=3 category=wildcard
"""The correct twin of wildcard__subgroup_fixed_ack: on a subgroup of every rank, rank 0
serves requests from anyone and replies to whoever asked (the sender recv(src=None,
group=sub) returns, which torch translated from a group rank); every worker sends one
request and waits for its reply.  Correct in every arrival order."""

import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sub = dist.new_group([0, 1, 2])
    buf = torch.zeros(4)
    if rank == 0:
        for _ in range(2):
            src = dist.recv(buf, src=None, group=sub)
            dist.send(torch.full((4,), float(src)), dst=src, group=sub)
    else:
        if rank == 2:
            time.sleep(0.5)
        dist.send(torch.ones(4), dst=0, group=sub)
        dist.recv(buf, src=0, group=sub)
        assert buf[0].item() == rank, buf
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
