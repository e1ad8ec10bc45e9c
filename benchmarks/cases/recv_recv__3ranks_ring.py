# dl2-case: label=deadlock world=3 category=recv-recv-cycle
# dl2-expect: ranks=0,1,2
"""Ring shift where every rank receives from its predecessor before sending:
a three-rank cycle of receives.
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
    dist.recv(inp, src=prv)  # dl2: culprit
    dist.send(out, dst=nxt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
