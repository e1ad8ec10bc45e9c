# dl2-case: label=defect world=2 category=dtype-mismatch
# dl2-expect: ranks=0,1
"""Rank 0 sends token ids as float32, rank 1 receives them into an int32 buffer (same
byte size, so gloo delivers garbage silently)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0, 4.0]), dst=1)  # dl2: culprit
    else:
        ids = torch.zeros(4, dtype=torch.int32)
        dist.recv(ids, src=0)  # dl2: culprit
        print(f"rank 1 received ids {ids.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
