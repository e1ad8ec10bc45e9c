# dl2-case: label=defect world=2 category=dtype-mismatch
# dl2-expect: ranks=0,1
"""Mixed-precision mix-up: rank 0 all-gathers its activations in bfloat16, rank 1 in
float16 (same byte size: the job completes with reinterpreted bits)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dtype = torch.bfloat16 if rank == 0 else torch.float16
    act = torch.full((4,), 1.5, dtype=dtype)
    out = torch.empty(8, dtype=dtype)
    dist.all_gather_into_tensor(out, act)  # dl2: culprit
    print(f"rank {rank}: {out.float().tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
