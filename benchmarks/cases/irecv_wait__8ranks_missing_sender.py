# dl2-case: label=deadlock world=8 category=irecv-wait
# dl2-expect: ranks=0,7
"""Rank 0 collects one result from each of the 7 workers with irecv; worker 7 filters
its results to nothing and sends nothing, then waits in the final barrier. Rank 0 waits
for the irecv from 7; workers 1 to 6 wait in the barrier."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    if rank == 0:
        bufs = [torch.empty(4) for _ in range(world)]
        works = [dist.irecv(bufs[src], src=src) for src in range(1, world)]  # dl2: culprit
        for work in works:
            work.wait()
    else:
        results = torch.full((4,), float(rank))
        if rank != 7:
            dist.send(results, dst=0)
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
