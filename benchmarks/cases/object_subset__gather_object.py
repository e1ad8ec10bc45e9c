# dl2-case: label=deadlock world=2 category=object-collective-subset
# dl2-expect: ranks=0,1
"""gather_object of evaluation results, called only by the rank that has results to
report (rank 1 evaluated nothing this epoch) before the final all_reduce."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    results = {"acc": 0.9} if rank == 0 else None
    if results is not None:
        out = [None] * world if rank == 0 else None
        dist.gather_object(results, out, dst=0)  # dl2: culprit
    t = torch.ones(4)
    dist.all_reduce(t)  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
