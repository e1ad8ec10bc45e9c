# dl2-case: label=defect world=2 category=p2p-dtype-mismatch
# dl2-expect: ranks=0,1
"""Rank 0 sends float32[4]; rank 1 receives into int32[4].

Same byte size, so plain gloo completes and rank 1 gets the float bits read as ints.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        dist.send(torch.ones(4), dst=1)  # dl2: culprit
    else:
        buf = torch.zeros(4, dtype=torch.int32)
        dist.recv(buf, src=0)  # dl2: culprit
        print("rank 1 received", buf.tolist())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
