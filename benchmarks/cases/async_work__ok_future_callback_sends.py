# dl2-case: label=ok world=3 category=async-work
"""Rank 0 starts an all_reduce on the group {0, 2} with async_op=True and chains a
callback on its future that sends the result to rank 1; its main thread meanwhile
waits in a recv from rank 1, which first receives from rank 0.  Rank 2 joins the
all_reduce only after 2 s.  For those 2 s ranks 0 and 1 both wait in a recv from each
other, but the callback (run by gloo's thread once the all_reduce completes) releases
them.  A rank's callbacks on a pending work's future may communicate: until they ran,
the rank is not stuck."""

import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair = dist.new_group([0, 2])
    x = torch.ones(2) * (rank + 1)
    if rank == 0:
        future = dist.all_reduce(x, group=pair, async_op=True).get_future()
        sent = future.then(lambda _: dist.send(x.clone(), dst=1))
        reply = torch.zeros(2)
        dist.recv(reply, src=1)
        sent.wait()
        assert reply.tolist() == [8.0, 8.0], reply
    elif rank == 1:
        value = torch.zeros(2)
        dist.recv(value, src=0)
        dist.send(value * 2, dst=0)
    else:
        time.sleep(2)
        dist.all_reduce(x, group=pair)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
