"""Rank 1's helper thread dies of a KeyError; the ranks then end cleanly (2 ranks)."""

import threading

import torch.distributed as dist


def helper(metrics: dict) -> None:
    print(metrics["acc"])  # mark: raise


dist.init_process_group("gloo")
if dist.get_rank() == 1:
    thread = threading.Thread(target=helper, args=({"loss": 0.5},), name="metrics")
    thread.start()
    thread.join()
dist.barrier()
dist.destroy_process_group()
