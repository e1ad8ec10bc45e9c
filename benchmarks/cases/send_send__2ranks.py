# dl2-case: label=deadlock world=2 category=send-send-cycle
# dl2-expect: ranks=0,1
"""Both ranks send before they receive.

gloo's send does not complete until the peer posts the matching receive, so each
rank waits in send for the other: a two-rank cycle.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    out = torch.full((4,), float(rank))
    inp = torch.empty(4)
    dist.send(out, dst=peer)  # dl2: culprit
    dist.recv(inp, src=peer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
