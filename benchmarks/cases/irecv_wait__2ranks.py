# dl2-case: label=deadlock world=2 category=irecv-wait-cycle
# dl2-expect: ranks=0,1
"""Non-blocking receive, but waited on before the isend is posted.

Both ranks wait on their irecv before either has posted its isend: the same
cycle as recv/recv, hidden behind the non-blocking API.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    out = torch.full((4,), float(rank))
    inp = torch.empty(4)
    dist.irecv(inp, src=peer).wait()  # dl2: culprit
    dist.isend(out, dst=peer).wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
