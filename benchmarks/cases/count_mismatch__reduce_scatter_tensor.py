# dl2-case: label=defect world=2 category=count-mismatch
# dl2-expect: ranks=0,1
"""reduce_scatter_tensor of a flattened gradient whose length differs between ranks
(rank 1 padded its flat buffer to 8 elements per shard, rank 0 did not)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    shard = 4 if rank == 0 else 8
    flat = torch.ones(2 * shard)
    out = torch.empty(shard)
    dist.reduce_scatter_tensor(out, flat)  # dl2: culprit
    print(f"rank {rank}: {out.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
