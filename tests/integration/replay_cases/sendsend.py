"""Two ranks exchange N bytes; ``sendsend.py N`` sends first on both ranks (needs an eager
buffer of at least N bytes), ``sendsend.py N twin`` lets rank 1 receive first (never needs one).
"""

import sys

import torch
import torch.distributed as dist


def main() -> None:
    nbytes = int(sys.argv[1])
    twin = len(sys.argv) > 2 and sys.argv[2] == "twin"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    outgoing = torch.full((nbytes,), rank + 1, dtype=torch.uint8)
    incoming = torch.zeros(nbytes, dtype=torch.uint8)
    if twin and rank == 1:
        dist.recv(incoming, src=peer)
        dist.send(outgoing, dst=peer)
    else:
        dist.send(outgoing, dst=peer)  # both ranks send first
        outgoing.fill_(0)  # a buffered send has taken its copy
        dist.recv(incoming, src=peer)
    assert int(incoming[0]) == peer + 1 and int(incoming[-1]) == peer + 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
