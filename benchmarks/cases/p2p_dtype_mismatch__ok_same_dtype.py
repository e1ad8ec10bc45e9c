# dl2-case: label=ok world=2 category=p2p-dtype-mismatch
"""Correct twin: rank 0 sends float32[4]; rank 1 receives into float32[4].
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        dist.send(torch.ones(4), dst=1)
    else:
        buf = torch.zeros(4, dtype=torch.float32)
        dist.recv(buf, src=0)
        print("rank 1 received", buf.tolist())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
