"""A torchrun job of 2 ranks; rank 1 is killed by SIGKILL (as the OOM killer ends a
process) between two all_reduce calls, while rank 0 waits in the second.  torchrun
then ends rank 0 itself.  No dl2 code."""

import os
import signal
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
batch = torch.ones(4)
dist.all_reduce(batch)
if dist.get_rank() == 1:
    time.sleep(1.0)  # rank 0 waits in the next all_reduce meanwhile
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(batch)  # mark: waits
dist.destroy_process_group()
