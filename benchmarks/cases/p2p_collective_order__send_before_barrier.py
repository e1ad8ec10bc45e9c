# dl2-case: label=deadlock world=2 category=p2p-collective-order
# dl2-expect: ranks=0,1
"""Rank 1 sends its result to rank 0 and then enters the epoch barrier; rank 0 enters
the barrier first and receives afterwards. gloo's send waits for the receive."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = torch.full((4,), float(rank))
    if rank == 1:
        dist.send(result, dst=0)  # dl2: culprit
        dist.barrier()
    else:
        dist.barrier()  # dl2: culprit
        dist.recv(result, src=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
