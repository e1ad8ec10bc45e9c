# dl2-case: label=defect world=3 category=rank-exit
# dl2-expect: ranks=0,2
"""A parameter-server exchange: each step rank 0 posts an irecv from every worker and
waits on them; worker 2 reads a shorter step count and exits after two steps.

Plain gloo does not hang: rank 0's wait on the irecv from rank 2 raises "Connection
closed by peer". gloo then calls that work completed: a recorder that wrote it
``done`` made the failure vanish (the verdict fell to job-failed, no finding).
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = 2 if rank == 2 else 3
    for step in range(steps):
        if rank == 0:
            bufs = [torch.zeros(4) for _ in range(1, world)]
            works = [dist.irecv(b, src=src) for src, b in zip(range(1, world), bufs)]  # dl2: culprit
            for work in works:
                work.wait()
        else:
            dist.isend(torch.ones(4) * (step + 1), dst=0).wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
