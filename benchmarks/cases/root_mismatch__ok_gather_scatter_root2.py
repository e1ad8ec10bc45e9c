# dl2-case: label=ok world=3 category=root-mismatch
"""Correct twin: gather to rank 2, then scatter back from rank 2, on every rank."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    t = torch.full((4,), float(rank))
    bucket = [torch.empty(4) for _ in range(world)] if rank == 2 else None
    dist.gather(t, bucket, dst=2)
    out = torch.empty(4)
    dist.scatter(out, [b * 2 for b in bucket] if rank == 2 else None, src=2)
    assert out.tolist() == [2.0 * rank] * 4, out
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
