# dl2-case: label=defect world=3 category=batch-order
# dl2-expect: ranks=0,1,2
"""A ring exchange split into two batch_isend_irecv calls per rank: first a batch with
the irecv from the predecessor, then a batch with the isend to the successor, all
waited afterwards.  gloo issues batch ops one by one, so the job completes; NCCL
launches each batch as one group on the rank's stream, in order, and every rank's
receive batch waits for a send that sits behind its peer's own receive batch."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = torch.full((8,), float(rank))
    inp = torch.zeros(8)
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, inp, prv)])  # dl2: culprit
    works += dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt)])
    for work in works:
        work.wait()
    assert inp.tolist() == [float(prv)] * 8
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
