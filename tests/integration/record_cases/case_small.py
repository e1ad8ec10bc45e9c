"""A 2-rank env-launched job that all_reduces once and writes $CASE_OUT/rank<R>.json."""

import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(3) * (rank + 1)
dist.all_reduce(t)
dist.destroy_process_group()
with open(os.path.join(os.environ["CASE_OUT"], f"rank{rank}.json"), "w") as f:
    json.dump({"all_reduce": t.tolist()}, f)
