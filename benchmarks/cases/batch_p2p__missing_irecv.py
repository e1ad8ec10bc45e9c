# dl2-case: label=deadlock world=4 category=batch-p2p
# dl2-expect: ranks=0,1,2,3
"""A ring exchange with batch_isend_irecv where the last rank builds its batch without
the irecv from its predecessor (an off-by-one in the op list). Rank 2 waits forever for
its isend to rank 3; everybody else finished the exchange and waits in the barrier."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = torch.full((4,), float(rank))
    inp = torch.empty(4)
    ops = [dist.P2POp(dist.isend, out, nxt)]
    if rank != world - 1:
        ops.append(dist.P2POp(dist.irecv, inp, prv))
    for req in dist.batch_isend_irecv(ops):  # dl2: culprit
        req.wait()
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
