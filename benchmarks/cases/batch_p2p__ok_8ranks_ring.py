# dl2-case: label=ok world=8 category=batch-p2p
"""Correct twin: an 8-rank ring with batch_isend_irecv in both directions, three steps."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for step in range(3):
        a, b = torch.empty(4), torch.empty(4)
        ops = [
            dist.P2POp(dist.isend, torch.full((4,), float(rank)), nxt),
            dist.P2POp(dist.isend, torch.full((4,), float(rank)), prv),
            dist.P2POp(dist.irecv, a, prv),
            dist.P2POp(dist.irecv, b, nxt),
        ]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        assert a[0].item() == prv and b[0].item() == nxt, (step, a, b)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
