# dl2-case: label=defect world=2 category=count-mismatch
# dl2-expect: ranks=0,1
"""Broadcast of a vocabulary table from rank 0 (8 entries) into a buffer that rank 1
sized from its own, smaller config (4 entries)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    table = torch.arange(8.0) if rank == 0 else torch.empty(4)
    dist.broadcast(table, src=0)  # dl2: culprit
    print(f"rank {rank}: {table.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
