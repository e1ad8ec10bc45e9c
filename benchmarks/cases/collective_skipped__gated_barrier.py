# dl2-case: label=deadlock world=2 category=collective-skipped
# dl2-expect: ranks=0,1
"""A rank-gated barrier: only rank 0 enters it.

Rank 0 waits in the barrier while rank 1 has gone on to the next all_reduce;
gloo does not match the two, and both wait forever.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        dist.barrier()  # dl2: culprit
    dist.all_reduce(t)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
