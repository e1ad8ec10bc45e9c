# dl2-case: label=deadlock world=2 category=root-mismatch
# dl2-expect: ranks=0,1
"""scatter_object_list with a different source on each rank: rank 0 scatters its work
plan from rank 0, rank 1 expects it from rank 1."""

import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    src = 0 if rank == 0 else 1
    plan = [{"shard": i} for i in range(2)] if rank == src else None
    out = [None]
    dist.scatter_object_list(out, plan, src=src)  # dl2: culprit
    print(f"rank {rank}: {out}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
