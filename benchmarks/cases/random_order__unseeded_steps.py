# dl2-case: label=deadlock world=2 category=random-order nondeterministic=1
# dl2-expect: ranks=0,1
"""Each rank draws its number of fine-tuning steps (2 or 3) from an unseeded RNG; each
step all_reduces the gradient. When the draws differ, the rank with more steps waits in
its last all_reduce while the other waits in the final barrier (a hang); when they
agree, the run completes (about half of the runs). Labelled by what can happen."""

import random

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = random.SystemRandom().choice([2, 3])
    for _ in range(steps):
        grad = torch.ones(8)
        dist.all_reduce(grad)  # dl2: culprit
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
