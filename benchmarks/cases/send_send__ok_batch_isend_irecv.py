# dl2-case: label=ok world=3 category=send-send-cycle
"""Correct twin of the ring: the send and the receive are posted together with
batch_isend_irecv, so no rank waits in a send before its receive is posted.
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
    ops = [
        dist.P2POp(dist.isend, out, nxt),
        dist.P2POp(dist.irecv, inp, prv),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    assert torch.equal(inp, torch.full((4,), float(prv))), inp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
