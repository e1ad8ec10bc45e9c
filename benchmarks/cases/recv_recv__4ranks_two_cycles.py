# dl2-case: label=deadlock world=4 category=recv-recv-cycle
# dl2-expect: ranks=0,1,2,3
"""Two independent pairs (0, 1) and (2, 3) exchange halo data, each rank receiving
before it sends: two separate two-rank cycles."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = rank ^ 1
    halo = torch.empty(4)
    dist.recv(halo, src=peer)  # dl2: culprit
    dist.send(torch.full((4,), float(rank)), dst=peer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
