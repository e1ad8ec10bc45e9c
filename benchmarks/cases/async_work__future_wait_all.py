# dl2-case: label=deadlock world=3 category=async-work
# dl2-expect: ranks=0,1,2
"""Rank 0 launches all_reduces on two groups with async_op=True and blocks on their
futures with torch.futures.wait_all (not Work.wait) before it sends rank 1 its input;
rank 1 receives that input before it joins the first group's all_reduce; rank 2 joins
the second at once.  Ranks 0 and 1 wait on each other.  No dl2 frame is on rank 0's
stack while it waits: the watchdog must read a thread in torch.futures as waiting on
its pending works, not as running Python code."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    first = dist.new_group([0, 1])
    second = dist.new_group([0, 2])
    x, y = torch.ones(2), torch.ones(2)
    if rank == 0:
        wa = dist.all_reduce(x, group=first, async_op=True)  # dl2: culprit
        wb = dist.all_reduce(y, group=second, async_op=True)
        torch.futures.wait_all([wa.get_future(), wb.get_future()])
        dist.send(torch.ones(3), dst=1)
    elif rank == 1:
        dist.recv(torch.zeros(3), src=0)  # dl2: culprit
        dist.all_reduce(x, group=first)
    else:
        dist.all_reduce(y, group=second)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
