# dl2-case: label=deadlock world=2 category=root-mismatch
# dl2-expect: ranks=0,1
"""Both ranks believe they are the root of the broadcast (src=0 on rank 0,
src=1 on rank 1): each waits for the other to receive, forever.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    src = 0 if rank == 0 else 1  # bug: every rank should use the same root
    t = torch.full((4,), float(rank))
    dist.broadcast(t, src=src)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
