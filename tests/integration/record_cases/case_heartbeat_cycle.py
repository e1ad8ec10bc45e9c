"""The main threads deadlock in recv/recv while each rank's daemon thread all_reduces on
a group of its own every 100 ms: the heartbeat's records keep the job-wide progress
clock fresh, so only the age of each rank's oldest open call shows the hang."""

import threading
import time

import torch
import torch.distributed as dist


def heartbeat(group):
    while True:
        dist.all_reduce(torch.ones(1), group=group)
        time.sleep(0.1)


dist.init_process_group("gloo")
rank = dist.get_rank()
beat = dist.new_group([0, 1])
threading.Thread(target=heartbeat, args=(beat,), daemon=True).start()
buf = torch.zeros(2)
dist.recv(buf, 1 - rank)  # both ranks receive first: the cycle
dist.destroy_process_group()
