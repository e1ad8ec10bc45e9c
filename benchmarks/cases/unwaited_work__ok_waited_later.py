# dl2-case: label=ok world=2 category=unwaited-work
"""Correct twin: rank 0 keeps the Works of its isends and waits on them after the loop
(in reverse order); rank 1 posts its irecvs in one batch_isend_irecv and waits on every
Work the batch returned."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    chunks = [torch.full((16,), float(i)) for i in range(5)]
    if rank == 0:
        works = [dist.isend(chunk, 1) for chunk in chunks]
        for work in reversed(works):
            work.wait()
    else:
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, c, 0) for c in chunks])
        for work in works:
            work.wait()
        assert [c[0].item() for c in chunks] == [0.0, 1.0, 2.0, 3.0, 4.0]
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
