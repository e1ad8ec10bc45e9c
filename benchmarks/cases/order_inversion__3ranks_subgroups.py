# dl2-case: label=defect world=3 category=order-inversion
# dl2-expect: ranks=0,1,2
"""Three pair groups {0,1}, {1,2}, {0,2}; each rank all-reduces on its two groups with
async_op=True and waits afterwards, but starts with "its own" pair: rank 0 with {0,1},
rank 1 with {1,2}, rank 2 with {0,2}.  gloo runs each group on its own threads, so the
job completes; on NCCL every rank can block in its first all_reduce waiting for a peer
that is blocked in another group's first (a cycle 0 -> 1 -> 2 -> 0 across groups)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pairs = {(0, 1): dist.new_group([0, 1]), (1, 2): dist.new_group([1, 2])}
    pairs[(0, 2)] = dist.new_group([0, 2])
    mine = [pair for pair in ((0, 1), (1, 2), (0, 2)) if rank in pair]
    if rank == 1:
        mine.reverse()  # rank 1 starts with (1, 2)
    if rank == 2:
        mine.reverse()  # rank 2 starts with (0, 2)
    tensors = [torch.ones(4), torch.ones(4)]
    first = dist.all_reduce(tensors[0], group=pairs[mine[0]], async_op=True)  # dl2: culprit
    second = dist.all_reduce(tensors[1], group=pairs[mine[1]], async_op=True)  # dl2: culprit
    first.wait()
    second.wait()
    assert all(t.tolist() == [2.0] * 4 for t in tensors)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
