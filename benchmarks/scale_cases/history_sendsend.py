"""N healthy all_reduces, then a send/send deadlock: ``history_sendsend.py N``.

Run by ``python -m benchmarks scale`` under ``dl2 run -n 2``.  Each rank prints its pid
(``DL2-PID``, so the benchmark can kill it past its timeout), makes N blocking
``all_reduce`` calls on a 4-element tensor (a long, healthy history), prints how long
they took (``DL2-HISTORY``) and ``DL2-BLOCK rank=R t=<time.time()>``, then sends to the
other rank: on gloo both block forever (send/send).
"""

import os
import sys
import time

import torch
import torch.distributed as dist

n = int(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"DL2-PID rank={rank} pid={os.getpid()}", flush=True)
tensor = torch.ones(4)
started = time.time()
for _ in range(n):
    dist.all_reduce(tensor)
print(f"DL2-HISTORY rank={rank} ops={n} s={time.time() - started:.3f}", flush=True)
print(f"DL2-BLOCK rank={rank} t={time.time():.6f}", flush=True)
dist.send(torch.ones(8), dst=1 - rank)  # dl2: culprit
