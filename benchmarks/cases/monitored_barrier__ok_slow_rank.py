# dl2-case: label=ok world=3 category=monitored-barrier
"""Correct twin: every rank calls monitored_barrier; rank 2 arrives 1.5 s late, well
within the 20 s timeout."""

import time
from datetime import timedelta

import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 2:
        time.sleep(1.5)
    dist.monitored_barrier(timeout=timedelta(seconds=20), wait_all_ranks=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
