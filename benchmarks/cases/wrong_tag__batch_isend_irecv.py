# dl2-case: label=deadlock world=2 category=wrong-tag
# dl2-expect: ranks=0,1
"""A batched exchange where the sender tags its message with the step number and the
receiver with step + 1 (it already incremented its counter)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    step = 3
    if rank == 0:
        ops = [dist.P2POp(dist.isend, torch.ones(4), 1, tag=step)]
    else:
        step += 1
        ops = [dist.P2POp(dist.irecv, torch.empty(4), 0, tag=step)]
    for req in dist.batch_isend_irecv(ops):  # dl2: culprit
        req.wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
