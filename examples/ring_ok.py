"""The same exchange done right: even ranks send first, odd ranks receive first.

    dl2 run -n 4 examples/ring_ok.py
"""

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    outgoing = torch.full((1024,), float(rank))
    incoming = torch.empty(1024)
    if rank % 2 == 0:
        dist.send(outgoing, dst=nxt)
        dist.recv(incoming, src=prev)
    else:
        dist.recv(incoming, src=prev)
        dist.send(outgoing, dst=nxt)
    assert incoming[0].item() == float(prev)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
