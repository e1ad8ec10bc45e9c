# dl2-case: label=deadlock world=2 category=unwaited-work
# dl2-expect: ranks=0,1
"""Rank 0 streams 5 chunks to rank 1 with isend in a loop and drops each Work (no
wait()); rank 1 receives them with blocking recvs.  gloo moves a P2P message only while
both works live: under plain gloo the dropped isends never transfer and rank 1 hangs in
its first recv (measured, torch 2.13), and rank 0 in the barrier.  The ranks agree on a
step count after the sends, so rank 1 posts its recvs only once rank 0 has dropped its
isends (a recv posted first would take the message: a race).  Under `dl2 run` the
recorder lets a dropped work go as well (a `drop` record), so the job hangs the same way:
dl2 proves the deadlock (rank 1's recv waits on rank 0, which dropped the matching isend;
rank 0's barrier waits on rank 1) and names the dropped isends (`unwaited-work`)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    chunks = [torch.full((16,), float(i)) for i in range(5)]
    if rank == 0:
        for chunk in chunks:
            dist.isend(chunk, 1)  # dl2: culprit
    dist.all_reduce(torch.ones(1))  # agree on the step count
    if rank == 1:
        for chunk in chunks:
            dist.recv(chunk, 0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
