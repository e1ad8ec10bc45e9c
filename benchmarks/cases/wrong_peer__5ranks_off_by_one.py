# dl2-case: label=deadlock world=5 category=wrong-peer
# dl2-expect: ranks=0,1,2,3,4
"""A 5-stage pipeline hand-off where the last stage computes its predecessor as
rank - 2 (off by one): stage 4 waits for stage 2, stage 3's send to 4 is never
received, and every earlier stage waits in the final barrier."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    act = torch.full((4,), float(rank))
    if rank > 0:
        prev = rank - 2 if rank == world - 1 else rank - 1
        dist.recv(act, src=prev)  # dl2: culprit
    if rank < world - 1:
        dist.send(act + 1, dst=rank + 1)
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
