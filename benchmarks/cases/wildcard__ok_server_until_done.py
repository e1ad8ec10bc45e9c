# dl2-case: label=ok world=3 category=wildcard
"""A server takes messages from any worker until every worker said it is done, and
replies (to the sender the wildcard returned) only to updates: what it does after a
receive depends on the message.  Workers send a different number of updates, then a
"done".  When the server's wildcard met a "done" it did not reply; had it met another
worker's update there, it would have replied to that worker, which a replay of the
recorded op sequence cannot show: a predictor that swapped that match called the
program deadlocked.  Correct in every arrival order."""

import time

import torch
import torch.distributed as dist

DONE = -1.0


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total = torch.zeros(1)
        done = 0
        while done < world - 1:
            msg = torch.zeros(2)
            src = dist.recv(msg)
            if msg[0] == DONE:
                done += 1
            else:
                total += msg[1]
                dist.send(total.clone(), dst=src)
    else:
        for _ in range(rank + 1):  # rank 1: 2 updates, rank 2: 3
            time.sleep(0.05 * rank)
            dist.send(torch.tensor([0.0, 1.0]), dst=0)
            dist.recv(torch.zeros(1), src=0)
        dist.send(torch.tensor([DONE, 0.0]), dst=0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
