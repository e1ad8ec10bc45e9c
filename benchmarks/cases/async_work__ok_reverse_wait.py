# dl2-case: label=ok world=3 category=async-work
"""Correct twin: two async all_reduces launched in the same order everywhere and waited
in reverse order (rank 2 also waits in launch order); works complete in launch order."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    a = torch.ones(4)
    b = torch.ones(16)
    wa = dist.all_reduce(a, async_op=True)
    wb = dist.all_reduce(b, async_op=True)
    order = [wa, wb] if rank == 2 else [wb, wa]
    for work in order:
        work.wait()
    assert a.tolist() == [3.0] * 4 and b.sum().item() == 48.0
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
