# dl2-case: label=deadlock world=3 category=wrong-peer nondeterministic=1
# dl2-expect: ranks=0,1,2
"""A ring exchange whose next rank is computed without the modulo: rank 2 sends to
rank 3, which does not exist in a world of 3.  gloo does not check the rank: rank 2
blocks forever inside the isend (seen on an idle machine), or, under load, fails, and
the others with it; rank 0 waits for a message from rank 2, rank 1 for its isend to
rank 2."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    out, inbox = torch.full((4,), float(rank)), torch.zeros(4)
    work = dist.isend(out, rank + 1)  # dl2: culprit
    dist.recv(inbox, (rank - 1) % world)  # dl2: culprit
    work.wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
