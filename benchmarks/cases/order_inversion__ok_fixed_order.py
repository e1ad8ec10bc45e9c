# dl2-case: label=ok world=3 category=order-inversion
"""Correct twin: the same three pair groups, async all_reduces waited afterwards, each
rank taking its groups in one global order ({0,1}, then {1,2}, then {0,2}).  No cycle
across groups: complete on gloo and on NCCL."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pairs = {(0, 1): dist.new_group([0, 1]), (1, 2): dist.new_group([1, 2])}
    pairs[(0, 2)] = dist.new_group([0, 2])
    mine = [pair for pair in ((0, 1), (1, 2), (0, 2)) if rank in pair]
    tensors = [torch.ones(4), torch.ones(4)]
    works = [
        dist.all_reduce(t, group=pairs[pair], async_op=True)
        for t, pair in zip(tensors, mine, strict=True)
    ]
    for work in reversed(works):
        work.wait()
    assert all(t.tolist() == [2.0] * 4 for t in tensors)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
