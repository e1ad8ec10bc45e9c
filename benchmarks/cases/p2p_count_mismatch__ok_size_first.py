# dl2-case: label=ok world=2 category=p2p-count-mismatch
"""Correct twin: a variable-length message sent as its length, then the payload."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        payload = torch.arange(7.0)
        dist.send(torch.tensor([payload.numel()]), dst=1)
        dist.send(payload, dst=1)
    else:
        n = torch.empty(1, dtype=torch.int64)
        dist.recv(n, src=0)
        buf = torch.empty(int(n.item()))
        dist.recv(buf, src=0)
        assert buf.tolist() == list(map(float, range(7)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
