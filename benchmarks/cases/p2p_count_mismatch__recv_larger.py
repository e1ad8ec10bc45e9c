# dl2-case: label=defect world=2 category=p2p-count-mismatch
# dl2-expect: ranks=0,1
"""Rank 0 sends 4 floats, rank 1 receives into a buffer of 8 (sized for a larger
hidden dimension)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        dist.send(torch.arange(4.0), dst=1)  # dl2: culprit
    else:
        buf = torch.zeros(8)
        dist.recv(buf, src=0)  # dl2: culprit
        print(f"rank 1 received {buf.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
