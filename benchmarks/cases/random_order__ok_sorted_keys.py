# dl2-case: label=ok world=2 category=random-order
"""Correct twin: the same per-name all_reduce, over sorted(names)."""

import torch
import torch.distributed as dist

SIZES = {"embed.weight": 4, "attn.qkv": 8, "mlp.fc": 16}


def main():
    dist.init_process_group("gloo")
    for name in sorted(set(SIZES)):
        grad = torch.ones(SIZES[name])
        dist.all_reduce(grad)
        assert grad.sum().item() == 2 * SIZES[name]
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
