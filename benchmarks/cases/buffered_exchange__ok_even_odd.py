# dl2-case: label=ok world=2 category=buffered-exchange buffer=64KiB
"""Correct twin, also run under `dl2 run --buffer-size 64KiB`: the same exchange of
65,532 bytes, but rank 0 sends first and rank 1 receives first, so every send meets a
posted receive whether or not it is buffered."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    out = torch.full((16383,), float(rank))
    inp = torch.zeros(16383)
    if rank == 0:
        dist.send(out, peer)
        dist.recv(inp, peer)
    else:
        dist.recv(inp, peer)
        dist.send(out, peer)
    assert inp[0].item() == float(peer)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
