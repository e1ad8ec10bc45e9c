# dl2-case: label=deadlock world=8 category=send-send-cycle
# dl2-expect: ranks=0,1,2,3,4,5,6,7
"""An 8-rank ring shift where every rank sends to its successor before receiving from
its predecessor: all eight wait in send."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    out = torch.full((4,), float(rank))
    inp = torch.empty(4)
    dist.send(out, dst=(rank + 1) % world)  # dl2: culprit
    dist.recv(inp, src=(rank - 1) % world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
