# dl2-case: label=ok world=2 category=wrong-tag
"""Correct twin: sender and receiver use the same tag."""

import torch
import torch.distributed as dist

GRAD_TAG = 1


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    buf = torch.full((4,), float(rank))
    if rank == 0:
        dist.send(buf, dst=1, tag=GRAD_TAG)
    else:
        dist.recv(buf, src=0, tag=GRAD_TAG)
        assert torch.equal(buf, torch.zeros(4)), buf
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
