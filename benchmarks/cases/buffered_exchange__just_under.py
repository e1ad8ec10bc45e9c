# dl2-case: label=defect world=2 category=buffered-exchange buffer=64KiB
# dl2-expect: ranks=0,1
"""Run under `dl2 run --buffer-size 64KiB` (the header's ``buffer``): both ranks send
16,383 float32 (65,532 bytes, 4 bytes under the buffer) to each other and then
receive.  The buffered sends return at once and the job completes, but the exchange
deadlocks wherever sends of that size are not buffered (gloo; NCCL with a smaller
NCCL_BUFFSIZE or a slightly larger tensor)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    out = torch.full((16383,), float(rank))
    inp = torch.zeros(16383)
    dist.send(out, peer)  # dl2: culprit
    dist.recv(inp, peer)
    assert inp[0].item() == float(peer)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
