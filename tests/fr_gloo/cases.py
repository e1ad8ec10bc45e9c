"""Small gloo jobs whose Flight Recorder dumps are the fixtures beside this file.

Run by ``generate.py`` (one process per rank, ``TORCH_FR_BUFFER_SIZE=2000``).  Each rank
writes torch's on-demand dump ``_dump_fr_trace()`` to ``$FR_OUT/fr_trace_rank_<r>``
when its program ends, or from a daemon thread ``FR_AFTER`` seconds in when it hangs
(gloo releases the GIL while a rank is blocked).  The ``# line:`` comments name what
the tests assert.
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace


def dump_and_exit() -> None:
    with open(os.path.join(os.environ["FR_OUT"], f"fr_trace_rank_{dist.get_rank()}"), "wb") as f:
        f.write(_dump_fr_trace(True, True, False))
    os._exit(0)


def main() -> None:
    case = sys.argv[1]
    dist.init_process_group("gloo")
    threading.Timer(float(os.environ.get("FR_AFTER", "4")), dump_and_exit).start()
    rank = dist.get_rank()
    g1 = dist.new_group([0, 1])
    g2 = dist.new_group([0, 1])
    x = torch.ones(4)
    dist.all_reduce(x)  # warm-up, every case: each group launched on by its members once
    dist.all_reduce(x, group=g1)
    dist.all_reduce(x, group=g2)
    if case == "cross_group":
        if rank == 0:
            dist.all_reduce(x, group=g1)  # line: cross rank 0
            dist.all_reduce(x, group=g2)
        else:
            dist.all_reduce(x, group=g2)  # line: cross rank 1
            dist.all_reduce(x, group=g1)
    elif case == "cross_group_ok":
        dist.all_reduce(x, group=g1)
        dist.all_reduce(x, group=g2)
    elif case in ("skipped", "skipped_ok"):
        dist.all_reduce(x)
        if rank == 0 or case == "skipped_ok":
            dist.all_reduce(x)  # line: skipped rank 0
        time.sleep(30 if case == "skipped" else 0)
    elif case in ("dtype", "dtype_ok"):
        if rank == 1 and case == "dtype":  # noqa: SIM108
            y = torch.ones(4, dtype=torch.int32)  # same bytes, another dtype
        else:
            y = torch.ones(4)
        dist.all_reduce(y)  # line: dtype
        dist.barrier()
    elif case in ("op_type", "op_type_ok"):
        if rank == 1 and case == "op_type":
            dist.broadcast(x, 0)  # line: op_type rank 1
        else:
            dist.all_reduce(x)  # line: op_type rank 0
        dist.all_reduce(x)
    elif case in ("early_exit", "early_exit_ok"):
        if rank == 1 and case == "early_exit":
            dump_and_exit()  # line: early exit
        dist.all_reduce(x)  # line: early_exit rank 0
    elif case in ("size", "size_ok"):
        parts = [torch.zeros(4), torch.zeros(4)]
        n = 3 if rank == 1 and case == "size" else 4
        dist.gather(torch.ones(n), parts if rank == 0 else None, dst=0)  # line: size
        dist.barrier()
    elif case in ("subgroup", "subgroup_ok"):  # 3 ranks: group g3 = [1, 2]
        g3 = dist.new_group([1, 2])
        if rank > 0:
            dist.all_reduce(x, group=g3)  # warm-up: both members launch on g3
            if rank == 1 or case == "subgroup_ok":
                dist.all_reduce(x, group=g3)  # line: subgroup rank 1
        dist.all_reduce(x)  # line: subgroup world
    dump_and_exit()


if __name__ == "__main__":
    main()
