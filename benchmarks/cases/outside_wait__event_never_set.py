# dl2-case: label=deadlock world=2 category=outside-wait interrupt=25
# dl2-expect: ranks=0,1
"""Rank 1 waits on a threading.Event its own heartbeat thread sets only on rank 0.

Rank 0 goes on into ``all_gather_into_tensor`` and waits there for rank 1, which sits in
``Event.wait()`` outside torch.distributed.  The job hangs until someone stops it (this
case is interrupted after 25 s).  dl2's verdict: ``hang``, naming rank 0's all_gather
and the line where rank 1 waits.
"""

import threading
import time

import torch
import torch.distributed as dist


def heartbeat(rank, ready):
    time.sleep(0.2)
    if rank == 0:  # the bug: only rank 0's thread ever signals
        ready.set()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ready = threading.Event()
    threading.Thread(target=heartbeat, args=(rank, ready), daemon=True).start()
    ready.wait()
    out = torch.empty(2 * 4)
    dist.all_gather_into_tensor(out, torch.full((4,), float(rank)))  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
