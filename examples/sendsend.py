"""A two-rank exchange that deadlocks: both ranks send first.

gloo makes a send wait until the peer posts the matching receive, so each rank waits
for the other forever. Run it under dl2:

    dl2 run -n 2 examples/sendsend.py
"""

import torch
import torch.distributed as dist


def exchange(rank: int) -> torch.Tensor:
    peer = 1 - rank
    outgoing = torch.full((1024,), float(rank))
    incoming = torch.empty(1024)
    dist.send(outgoing, dst=peer)  # both ranks block here
    dist.recv(incoming, src=peer)
    return incoming


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    received = exchange(rank)
    print(f"rank {rank} received {received[0].item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
