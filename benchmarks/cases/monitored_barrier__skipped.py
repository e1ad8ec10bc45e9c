# dl2-case: label=defect world=3 category=monitored-barrier
# dl2-expect: ranks=0,1,2
"""Ranks 0 and 1 enter a monitored_barrier (5 s timeout) before saving; rank 2 skipped
it and waits in the plain barrier that follows. After 5 s rank 0's monitored_barrier
raises "Rank 2 failed to pass monitoredBarrier", rank 0 exits with the error and the
others then fail ("Connection closed by peer")."""

from datetime import timedelta

import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank != 2:
        dist.monitored_barrier(timeout=timedelta(seconds=5))  # dl2: culprit
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
