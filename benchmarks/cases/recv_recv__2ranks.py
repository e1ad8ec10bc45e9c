# dl2-case: label=deadlock world=2 category=recv-recv-cycle
# dl2-expect: ranks=0,1
"""Both ranks receive before they send: each waits for a message the other
will only send after its own receive completes.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    out = torch.full((4,), float(rank))
    inp = torch.empty(4)
    dist.recv(inp, src=peer)  # dl2: culprit
    dist.send(out, dst=peer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
