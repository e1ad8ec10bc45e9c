# dl2-case: label=defect world=2 category=count-mismatch
# dl2-expect: ranks=0,1
"""Coalesced all_reduce of the gradients of a model whose parameter list differs
across ranks: rank 1 built an extra head (3 tensors), rank 0 did not (2 tensors).

The coalesced call flattens the list into one buffer: 8 elements against 12. gloo's
transport thread fails its size enforce and aborts one rank (SIGABRT); the other
fails with "Connection reset by peer". The failure is the mismatch's doing: the
report names the mismatch, not a rank that "left".
"""

import warnings

import torch
import torch.distributed as dist


def main():
    warnings.simplefilter("ignore", FutureWarning)  # all_reduce_coalesced is deprecated
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    grads = [torch.ones(4) for _ in range(3 if rank == 1 else 2)]
    dist.all_reduce_coalesced(grads)  # dl2: culprit
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
