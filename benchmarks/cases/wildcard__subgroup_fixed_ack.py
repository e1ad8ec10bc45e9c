# dl2-case: label=defect world=3 category=wildcard
# dl2-expect: ranks=0,1,2
"""On a subgroup of every rank, rank 0 takes the first message from anyone
(recv(src=None, group=sub)), acknowledges it to rank 1 by name, as if rank 1 always came
first, then takes the second.  Rank 2 sends late, so in this run rank 1's message is
the first and the job completes; had rank 2's come first, rank 0 would sit in its
unbuffered send of the ack to rank 1 while rank 1 sits in its own send to rank 0: a
deadlock another arrival order reaches.  torch hands a subgroup's sender back through
its group-to-global translation, which dl2 must follow to tell this fixed ack from a
reply to the sender (wildcard__ok_subgroup_reply_to_sender)."""

import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sub = dist.new_group([0, 1, 2])
    if rank == 0:
        buf = torch.empty(4)
        dist.recv(buf, src=None, group=sub)
        dist.send(torch.ones(4), 1, group=sub)  # dl2: culprit
        dist.recv(buf, src=None, group=sub)
    else:
        if rank == 2:
            time.sleep(1.0)
        dist.send(torch.full((4,), float(rank)), 0, group=sub)  # dl2: culprit
        if rank == 1:
            dist.recv(torch.empty(4), 0, group=sub)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
