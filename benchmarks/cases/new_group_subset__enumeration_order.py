# dl2-case: label=deadlock world=4 category=new-group-subset nondeterministic=1
# dl2-expect: ranks=0,1,2,3
"""new_subgroups_by_enumeration with the list of groups built "my group first": ranks
0 and 1 pass [[0, 1], [2, 3]], ranks 2 and 3 pass [[2, 3], [0, 1]].  new_group runs for
each entry in order, so the first group created (one name, one store prefix) is [0, 1]
on ranks 0 and 1 and [2, 3] on ranks 2 and 3.  Depending on timing the job hangs while
the groups connect or runs with ranks paired wrongly."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mine = [0, 1] if rank < 2 else [2, 3]
    other = [2, 3] if rank < 2 else [0, 1]
    sub, _ = dist.new_subgroups_by_enumeration([mine, other])  # dl2: culprit
    total = torch.ones(2) * rank
    dist.all_reduce(total, group=sub)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
