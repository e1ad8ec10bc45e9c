# online: world=2 category=send-send-after-history
# Not one of the latency cases (dl_*.py): ``python -m benchmarks model --only=run`` runs
# it, with DL2_BENCH_STEPS healthy all_reduce calls before the send/send deadlock.
import os

import torch
import torch.distributed as dist
from _common import blocking
from _common import setup

rank, _ = setup()
tensor = torch.ones(4)
for _ in range(int(os.environ.get("DL2_BENCH_STEPS", "1000"))):
    dist.all_reduce(tensor)
blocking()
dist.send(torch.ones(8), dst=1 - rank)
