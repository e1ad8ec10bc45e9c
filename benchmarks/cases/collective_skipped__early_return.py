# dl2-case: label=deadlock world=2 category=collective-skipped
# dl2-expect: ranks=0,1
"""Rank 1 returns from the training loop one step early (a rank-local stop
condition) and waits in the final barrier while rank 0 waits in its last
all_reduce.
"""

import torch
import torch.distributed as dist

STEPS = 3


def train(rank):
    t = torch.ones(4)
    for step in range(STEPS):
        if rank == 1 and step == STEPS - 1:
            return  # rank-local early stop
        dist.all_reduce(t)  # dl2: culprit


def main():
    dist.init_process_group("gloo")
    train(dist.get_rank())
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
