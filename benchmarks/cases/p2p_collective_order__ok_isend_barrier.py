# dl2-case: label=ok world=2 category=p2p-collective-order
"""Correct twin: rank 1 posts the send with isend before the barrier and waits for it
after; rank 0 receives after the barrier."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = torch.full((4,), float(rank))
    if rank == 1:
        work = dist.isend(result, dst=0)
        dist.barrier()
        work.wait()
    else:
        dist.barrier()
        dist.recv(result, src=1)
        assert result[0].item() == 1.0
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
