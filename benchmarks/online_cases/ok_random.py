# online: world=2 category=ok
"""A correct 2-rank job whose ranks are slow at random: it must never get a verdict.

Before each of its ops, each rank may sleep 0-3 s (a slow rank), compute for a while
(a long compute phase) or go straight on.  The ops are the same on both ranks (drawn
from one shared seed): collectives of every kind, a subgroup collective, an object
collective and P2P exchanges in a correct order.
"""

import os
import random
import time

import torch
import torch.distributed as dist
from _common import setup

OPS = 4
KINDS = (
    "all_reduce",
    "broadcast",
    "barrier",
    "all_gather",
    "gather",
    "send_recv",
    "isend_irecv",
    "all_gather_object",
    "subgroup",
)

rank, rng = setup()
shared = random.Random(os.environ.get("DL2_BENCH_SEED", "0"))
peer = 1 - rank
sub = dist.new_group([0, 1])


def compute(seconds: float) -> None:
    end = time.monotonic() + seconds
    a = torch.randn(48, 48)
    while time.monotonic() < end:
        a = torch.tanh(a @ a)


def pause() -> None:
    draw = rng.random()
    if draw < 0.5:
        time.sleep(rng.uniform(0.0, 3.0))
    elif draw < 0.7:
        compute(rng.uniform(0.2, 1.5))


def run(kind: str, root: int) -> None:
    t = torch.full((16,), float(rank))
    if kind == "all_reduce":
        dist.all_reduce(t)
    elif kind == "broadcast":
        dist.broadcast(t, src=root)
    elif kind == "barrier":
        dist.barrier()
    elif kind == "all_gather":
        dist.all_gather([torch.empty(16) for _ in range(2)], t)
    elif kind == "gather":
        dist.gather(t, [torch.empty(16) for _ in range(2)] if rank == root else None, dst=root)
    elif kind == "send_recv":
        if rank == root:
            dist.send(t, dst=peer)
            dist.recv(t, src=peer)
        else:
            dist.recv(t, src=peer)
            dist.send(t, dst=peer)
    elif kind == "isend_irecv":
        out = torch.empty(16)
        works = [dist.isend(t, dst=peer), dist.irecv(out, src=peer)]
        for work in works:
            work.wait()
    elif kind == "all_gather_object":
        dist.all_gather_object([None, None], {"rank": rank})
    elif kind == "subgroup":
        dist.all_reduce(t, group=sub)


for _ in range(OPS):
    kind, root = shared.choice(KINDS), shared.randrange(2)
    pause()
    run(kind, root)
dist.destroy_process_group()
