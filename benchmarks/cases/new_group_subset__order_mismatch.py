# dl2-case: label=deadlock world=3 category=new-group-subset
# dl2-expect: ranks=0,1,2
"""Every rank creates the groups {0, 1} and {1, 2}, but rank 2 creates them in the
opposite order (its code builds the groups from a dict). Groups are matched by creation
order, not by member list."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    specs = [[0, 1], [1, 2]]
    if rank == 2:
        specs.reverse()
    groups = {tuple(s): dist.new_group(s) for s in specs}  # dl2: culprit
    t = torch.ones(4)
    if rank in (0, 1):
        dist.all_reduce(t, group=groups[(0, 1)])
    if rank in (1, 2):
        dist.all_reduce(t, group=groups[(1, 2)])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
