# dl2-case: label=defect world=2 category=unwaited-work
# dl2-expect: ranks=0,1
"""Rank 1 posts an irecv for a late status message, never waits on it, and returns from
main with the Work outstanding (it only meant to "check later").  Rank 0 sends the
status with a blocking send.  Under plain gloo the dropped irecv never receives and
rank 0 hangs in its send (measured, torch 2.13); under `dl2 run` the recorder holds the
work, the job completes and dl2 reports the outstanding irecv (`defect`)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    status = torch.zeros(4)
    dist.barrier()
    if rank == 1:
        pending = dist.irecv(status, 0)  # dl2: culprit
        del pending
    else:
        dist.send(torch.ones(4), 1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
