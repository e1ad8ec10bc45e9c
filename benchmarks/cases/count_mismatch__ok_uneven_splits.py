# dl2-case: label=ok world=3 category=count-mismatch
"""Correct twin: uneven all_to_all_single whose splits are exchanged first (MoE token
dispatch): rank r sends r + p + 1 elements to peer p."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    in_splits = [rank + p + 1 for p in range(world)]
    counts = torch.tensor(in_splits)
    out_counts = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(out_counts, counts)
    out_splits = out_counts.tolist()
    send = torch.full((sum(in_splits),), float(rank))
    recv = torch.empty(sum(out_splits))
    dist.all_to_all_single(recv, send, output_split_sizes=out_splits, input_split_sizes=in_splits)
    expect = [float(p) for p in range(world) for _ in range(out_splits[p])]
    assert recv.tolist() == expect, recv
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
