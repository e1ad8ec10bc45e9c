# dl2-case: label=ok world=2 category=async-work
"""Rank 0 starts an all_reduce with async_op=True (rank 1 joins it only after rank 0's
"go" message), then saves a local checkpoint with torch.distributed.checkpoint
(no_dist=True: planning and writing run as plain Python inside torch.distributed for
seconds), then sends "go" and waits on the all_reduce; rank 1 waits in its recv
meanwhile.  Nothing is stuck.  A watchdog that took any frame in torch.distributed for
a wait in communication read rank 0 as waiting on its all_reduce, proved a deadlock
with rank 1's recv and stopped a correct job."""

import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    grad = torch.ones(2)
    if rank == 0:
        state = {f"layer{i}.weight": torch.zeros(4) for i in range(3000)}
        work = dist.all_reduce(grad, async_op=True)
        with tempfile.TemporaryDirectory() as directory:
            dcp.save(state, checkpoint_id=directory, no_dist=True)
        dist.send(torch.ones(1), dst=1)
        work.wait()
    else:
        dist.recv(torch.zeros(1), src=0)
        dist.all_reduce(grad)
    assert grad.tolist() == [2.0, 2.0]
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
