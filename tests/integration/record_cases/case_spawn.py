"""torch.multiprocessing.spawn of 2 workers that all_reduce once; no dl2 code.

argv: PORT OUT_DIR.  Each worker writes its result to OUT_DIR/rank<R>.json.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.ones(3) * (rank + 1)
    dist.all_reduce(t)  # mark: all_reduce
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"all_reduce": t.tolist()}, f)


if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]), sys.argv[2]), nprocs=2)
