# dl2-case: label=ok world=2 category=recv-recv-cycle
"""Correct twin: rank 0 receives first, rank 1 sends first."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    out = torch.full((4,), float(rank))
    inp = torch.empty(4)
    if rank == 0:
        dist.recv(inp, src=peer)
        dist.send(out, dst=peer)
    else:
        dist.send(out, dst=peer)
        dist.recv(inp, src=peer)
    assert torch.equal(inp, torch.full((4,), float(peer))), inp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
