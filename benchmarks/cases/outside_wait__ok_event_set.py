# dl2-case: label=ok world=2 category=outside-wait interrupt=25
"""Correct twin: every rank's heartbeat thread sets its event."""

import threading
import time

import torch
import torch.distributed as dist


def heartbeat(ready):
    time.sleep(0.2)
    ready.set()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ready = threading.Event()
    threading.Thread(target=heartbeat, args=(ready,), daemon=True).start()
    ready.wait()
    out = torch.empty(2 * 4)
    dist.all_gather_into_tensor(out, torch.full((4,), float(rank)))
    assert out.tolist() == [0.0] * 4 + [1.0] * 4, out
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
