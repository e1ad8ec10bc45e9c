# dl2-case: label=deadlock world=8 category=collective-skipped
# dl2-expect: ranks=0,1,2,3,4,5,6,7
"""Eight ranks; rank 5 skips the second of three all_reduces (its local batch was
empty) and waits in the final barrier while the other seven wait in the all_reduce."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(3):
        if rank == 5 and step == 1:
            continue
        t = torch.full((8,), float(rank))
        dist.all_reduce(t)  # dl2: culprit
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
