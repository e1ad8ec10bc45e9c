# dl2-case: label=deadlock world=2 category=rank0-only
# dl2-expect: ranks=0,1
"""Evaluation only on rank 0, but evaluate() averages its accuracy with an all_reduce
(copied from the distributed evaluation helper). Rank 1 waits in the next epoch's
broadcast of the shuffled indices."""

import torch
import torch.distributed as dist


def evaluate(w):
    acc = torch.tensor([float(w.sum())])
    dist.all_reduce(acc)  # dl2: culprit
    return acc.item() / dist.get_world_size()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    w = torch.ones(4)
    for epoch in range(2):
        perm = torch.randperm(8) if rank == 0 else torch.empty(8, dtype=torch.int64)
        dist.broadcast(perm, src=0)  # dl2: culprit
        if rank == 0:
            print(f"epoch {epoch}: acc {evaluate(w)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
