# dl2-case: label=ok world=6 category=subgroup-misuse
"""Correct twin: six ranks in three pairs (new_subgroups); each pair all_reduces on its
subgroup a different number of times (pairs are independent), then every rank joins a
world all_reduce."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair, _ = dist.new_subgroups(group_size=2)
    t = torch.full((4,), float(rank))
    for _ in range(1 + rank // 2):
        dist.all_reduce(t, group=pair)
    total = torch.ones(1)
    dist.all_reduce(total)
    assert total.item() == 6.0
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
