# dl2-case: label=deadlock world=3 category=collective-skipped
# dl2-expect: ranks=0,1,2
"""Rank 2 has no data this round and skips the scatter of work items; it goes on to
the final barrier while ranks 0 and 1 wait in the scatter."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    has_data = rank != 2
    out = torch.empty(4)
    if has_data:
        items = [torch.full((4,), float(i)) for i in range(world)] if rank == 0 else None
        dist.scatter(out, items, src=0)  # dl2: culprit
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
