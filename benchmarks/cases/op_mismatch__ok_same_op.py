# dl2-case: label=ok world=2 category=op-mismatch
"""Correct twin: both ranks call all_gather."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    t = torch.full((4,), float(rank))
    gathered = [torch.empty(4) for _ in range(world)]
    dist.all_gather(gathered, t)
    assert torch.equal(torch.stack(gathered)[:, 0], torch.arange(world, dtype=torch.float32))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
