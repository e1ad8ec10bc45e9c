"""torch.multiprocessing.spawn of 2 workers; worker 1 is killed by SIGKILL (as the OOM
killer ends a process) between two all_reduce calls, while worker 0 waits in the
second.  mp.spawn then ends worker 0 itself.  No dl2 code.  argv: PORT."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    batch = torch.ones(4)
    dist.all_reduce(batch)
    if rank == 1:
        time.sleep(1.0)  # worker 0 waits in the next all_reduce meanwhile
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(batch)  # mark: waits
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]),), nprocs=2)
