# dl2-case: label=deadlock world=2 category=op-mismatch
# dl2-expect: ranks=0,1
"""Expert routing: rank 0 exchanges tokens with all_to_all, rank 1 (an older code path)
uses all_gather on same-sized chunks."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    send = [torch.full((4,), float(rank)) for _ in range(world)]
    recv = [torch.empty(4) for _ in range(world)]
    if rank == 0:
        dist.all_to_all(recv, send)  # dl2: culprit
    else:
        dist.all_gather(recv, send[0])  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
