# dl2-case: label=deadlock world=3 category=wrong-peer
# dl2-expect: ranks=0,1,2
"""Even/odd ring shift with a sign error in the source rank.

``prv`` should be ``rank - 1``; with ``rank + 1`` rank 1 (odd) receives from
rank 2, while rank 0 waits in its send to rank 1 and rank 2 waits in its send to
rank 0: the cycle 0 -> 1 -> 2 -> 0.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    nxt = (rank + 1) % world
    prv = (rank + 1) % world  # bug: should be (rank - 1) % world
    out = torch.full((4,), float(rank))
    inp = torch.empty(4)
    if rank % 2 == 0:
        dist.send(out, dst=nxt)  # dl2: culprit
        dist.recv(inp, src=prv)
    else:
        dist.recv(inp, src=prv)  # dl2: culprit
        dist.send(out, dst=nxt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
