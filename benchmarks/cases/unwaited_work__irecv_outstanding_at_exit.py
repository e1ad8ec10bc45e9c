# dl2-case: label=defect world=2 category=unwaited-work
# dl2-expect: ranks=0,1
"""Rank 1 posts an irecv for a late status message, never waits on it, and returns from
main with the Work outstanding (it only meant to "check later").  Rank 0 sends the
status with a blocking send.  gloo may tear the pair down before the transfer: rank 0
then hangs in its send or fails with "Connection closed by peer"."""

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
