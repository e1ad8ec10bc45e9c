# dl2-case: label=defect world=2 category=random-order nondeterministic=1
# dl2-expect: ranks=0,1
"""Gradients are all_reduced per parameter name in the iteration order of a set of
strings, which depends on each process's hash seed (PYTHONHASHSEED is random per
process). The sizes differ per name, so when the orders differ the first mismatched
all_reduce pairs tensors of different sizes (gloo aborts a rank); in about one run in
six the two orders agree and the run completes. Labelled by what can happen."""

import torch
import torch.distributed as dist

SIZES = {"embed.weight": 4, "attn.qkv": 8, "mlp.fc": 16}


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    names = set(SIZES)
    for name in names:
        grad = torch.ones(SIZES[name])
        dist.all_reduce(grad)  # dl2: culprit
    print(f"rank {rank}: order {list(names)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
