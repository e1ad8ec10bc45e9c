# dl2-case: label=ok world=2 category=collective-order
"""Correct twin: both ranks issue all_reduce then broadcast."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    grads = torch.full((4,), float(rank))
    params = torch.full((4,), float(rank))
    dist.all_reduce(grads)
    dist.broadcast(params, src=0)
    assert torch.equal(grads, torch.ones(4)), grads
    assert torch.equal(params, torch.zeros(4)), params
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
