# dl2-case: label=ok world=3 category=wrong-peer
"""Correct twin of the even/odd ring shift with the right source rank."""

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
    if rank % 2 == 0:
        dist.send(out, dst=nxt)
        dist.recv(inp, src=prv)
    else:
        dist.recv(inp, src=prv)
        dist.send(out, dst=nxt)
    assert torch.equal(inp, torch.full((4,), float(prv))), inp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
