# dl2-case: label=deadlock world=3 category=completion-order
# dl2-expect: ranks=0
"""Rank 0 posts irecv from ranks 1 and 2 and polls is_completed() to handle whichever
arrives first. Under gloo a P2P work only reports completion once it has been waited
on, so the loop spins forever although both messages arrived: ranks 1 and 2 wait in the
barrier, rank 0 never leaves its polling loop (a hang outside any communication call)."""

import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        bufs = {src: torch.empty(4) for src in (1, 2)}
        works = {src: dist.irecv(bufs[src], src=src) for src in (1, 2)}
        first = None
        while first is None:
            first = next((s for s, w in works.items() if w.is_completed()), None)  # dl2: culprit
            time.sleep(0.01)
        for work in works.values():
            work.wait()
    else:
        dist.send(torch.full((4,), float(rank)), dst=0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
