"""Rank 0 sends 5 tensors in one batch_isend_irecv; rank 1 receives them in a batch of 4
(waited on) and then a batch of 1.  gloo issues batches op by op, so this completes; NCCL
launches each batch as one unit and would hang.  ``batches.py twin`` receives all 5 in one
batch.
"""

import sys

import torch
import torch.distributed as dist


def main() -> None:
    twin = len(sys.argv) > 1 and sys.argv[1] == "twin"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensors = [torch.zeros(8) for _ in range(5)]
    if rank == 0:
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 1) for t in tensors])
        for work in works:
            work.wait()
    else:
        for part in [tensors] if twin else [tensors[:4], tensors[4:]]:
            works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, t, 0) for t in part])
            for work in works:
                work.wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
