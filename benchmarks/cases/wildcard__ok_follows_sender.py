# dl2-case: label=ok world=3 category=wildcard
"""Correct twin of the wildcard race: rank 0 takes the first message from anyone and then
the second from the *other* worker, computed from the sender the wildcard returned
(``3 - first``), so any arrival order completes.  Rank 2 sends later, so the recorded
run matches rank 1 first; a replay that kept the named recv's peer as recorded (rank 2)
would predict a deadlock for the other order that the program never reaches."""

import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    buf = torch.zeros(4)
    if rank == 0:
        first = dist.recv(buf)
        dist.recv(buf, src=3 - first)
    else:
        time.sleep(0.3 * (rank - 1))
        dist.send(torch.full((4,), float(rank)), dst=0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
