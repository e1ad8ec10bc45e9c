# dl2-case: label=defect world=3 category=new-group-subset
# dl2-expect: ranks=0,1,2
"""new_group([0, 1]) is called by its members only; rank 2 skips it.

torch documents that every rank of the job must call new_group, even ranks that
are not members. With gloo in torch 2.13 this particular run happens to complete
(members rendezvous among themselves), but the ranks' group counters now
disagree, so any later new_group pairs up groups wrongly.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    if rank in (0, 1):
        pair = dist.new_group([0, 1])  # dl2: culprit
        dist.all_reduce(t, group=pair)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
