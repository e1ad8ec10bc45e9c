# dl2-case: label=ok world=2 category=p2p-collective-order
"""Rank 0 receives rank 1's message in a background thread (after some work) while its
main thread waits in the barrier; rank 1 sends, then enters the barrier.  Read one
thread at a time this is a send waiting on a rank inside a barrier, but rank 0's other
thread posts the recv and everything completes: a correct program."""

import threading
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    inbox = torch.zeros(4)
    if rank == 0:

        def receive():
            time.sleep(2.0)  # preparing the buffer
            dist.recv(inbox, src=1)

        worker = threading.Thread(target=receive)
        worker.start()
        dist.barrier()
        worker.join()
    else:
        dist.send(torch.ones(4), dst=0)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
