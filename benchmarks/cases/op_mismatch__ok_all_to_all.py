# dl2-case: label=ok world=3 category=op-mismatch
"""Correct twin: every rank uses all_to_all (list form; gloo needs equal chunk sizes),
twice, with per-peer contents checked."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    for _ in range(2):
        send = [torch.full((4,), float(10 * rank + p)) for p in range(world)]
        recv = [torch.empty(4) for _ in range(world)]
        dist.all_to_all(recv, send)
        for p in range(world):
            assert recv[p].tolist() == [float(10 * p + rank)] * 4, recv
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
