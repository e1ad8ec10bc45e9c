# dl2-case: label=ok world=2 category=batch-order
"""Correct twin: the two ranks group the same exchange differently.  Rank 0 posts its
isend and irecv in one batch_isend_irecv; rank 1 posts a batch with its irecv, then a
batch with its isend.  Rank 0's single batch progresses both directions at once, so
NCCL completes it whatever its buffer size (and gloo too)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    out = torch.full((1024,), float(rank))
    inp = torch.zeros(1024)
    if rank == 0:
        works = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, inp, peer)]
        )
    else:
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, inp, peer)])
        works += dist.batch_isend_irecv([dist.P2POp(dist.isend, out, peer)])
    for work in works:
        work.wait()
    assert inp.tolist() == [float(peer)] * 1024
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
