# dl2-case: label=deadlock world=3 category=send-send-cycle
# dl2-expect: ranks=0,1,2
"""Ring shift where every rank sends to its successor before receiving.

Each rank waits in send for its successor, which is itself waiting in send:
a three-rank cycle 0 -> 1 -> 2 -> 0.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    nxt = (rank + 1) % world
    prv = (rank - 1) % world
    out = torch.full((4,), float(rank))
    inp = torch.empty(4)
    dist.send(out, dst=nxt)  # dl2: culprit
    dist.recv(inp, src=prv)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
