"""Four ranks, four pair groups, a deadlock across groups: each rank reduces with its
right-hand pair first, while its left-hand neighbour does the same.

Rank r belongs to the groups {r, r+1} and {r-1, r} (mod 4) and calls all_reduce on
{r, r+1} first; its right neighbour is inside all_reduce on its own right-hand group, so
every rank waits on the next: 0 -> 1 -> 2 -> 3 -> 0. Run it under dl2:

    dl2 run -n 4 examples/crossed_groups.py
"""

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # every rank creates every group, in the same order (new_group's rule)
    pairs = [dist.new_group([r, (r + 1) % world]) for r in range(world)]
    right, left = pairs[rank], pairs[(rank - 1) % world]
    grads = torch.ones(256)
    dist.all_reduce(grads, group=right)  # each rank waits here on its right neighbour
    dist.all_reduce(grads, group=left)
    print(f"rank {rank}: {grads[0].item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
