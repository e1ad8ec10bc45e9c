# dl2-case: label=ok world=2 category=unwaited-work
"""Correct twin: rank 1 posts the irecv and waits on it before the barrier; the
all_reduce both ranks issue with async_op=True first is waited after the exchange."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    status = torch.zeros(4)
    grads = torch.ones(8)
    reduce = dist.all_reduce(grads, async_op=True)
    if rank == 1:
        pending = dist.irecv(status, 0)
        pending.wait()
        assert status.tolist() == [1.0] * 4
    else:
        dist.send(torch.ones(4), 1)
    reduce.wait()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
