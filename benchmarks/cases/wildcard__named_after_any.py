# dl2-case: label=deadlock world=3 category=wildcard
# dl2-expect: ranks=0,1,2
"""Rank 0 takes the first message from anyone (recv(src=None)), then one more named from
rank 1, as if rank 1 always sent twice; each worker sends once.  Rank 1's message is
the first (rank 2 sends only after rank 1 tells it to, which rank 1 does once its own
message is received), so the named recv waits forever for a second one from rank 1,
rank 2's send is never received and rank 1 waits in the final barrier."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    buf = torch.zeros(4)
    if rank == 0:
        dist.recv(buf)
        dist.recv(buf, src=1)  # dl2: culprit
    elif rank == 1:
        dist.send(torch.full((4,), 1.0), dst=0)
        dist.send(torch.zeros(1), dst=2)  # rank 2 may send now
    else:
        dist.recv(torch.zeros(1), src=1)
        dist.send(torch.full((4,), 2.0), dst=0)
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
