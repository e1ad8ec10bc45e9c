# dl2-case: label=deadlock world=2 category=root-mismatch
# dl2-expect: ranks=0,1
"""dist.reduce with a different destination on each rank (each rank believes it is the
root that collects the sum, e.g. a per-rank "dst=rank" typo)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.full((4,), float(rank + 1))
    dist.reduce(t, dst=rank)  # dl2: culprit
    print(f"rank {rank}: reduce -> {t.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
