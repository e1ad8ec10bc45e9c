"""Rank 0 sets a key on the job's store and leaves at once; rank 1 uses the store after
rank 0's process ended.  Under torchrun the store is the agent's and outlives any rank;
``dl2 run -n`` must host it the same way (with rank 0 hosting it, rank 1's calls fail)."""

import sys
import time

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_store

dist.init_process_group("gloo")
store = _get_default_store()
if dist.get_rank() == 0:
    store.set("from0", "hello")
    sys.exit(0)
time.sleep(3)  # rank 0 is gone by now
store.set("from1", "late")
assert store.get("from0") == b"hello"
print("STORE_OUTLIVED_RANK0", flush=True)
