# dl2-case: label=deadlock world=2 category=object-collective-subset
# dl2-expect: ranks=0,1
"""all_gather_object called by rank 0 only (e.g. to log statistics).

Rank 0 waits inside all_gather_object (its first internal all_gather of the
object sizes) while rank 1 waits in the final barrier.
"""

import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    stats = {"rank": rank, "loss": 0.5}
    gathered = [None] * world
    if rank == 0:
        dist.all_gather_object(gathered, stats)  # dl2: culprit
        print(gathered)
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
