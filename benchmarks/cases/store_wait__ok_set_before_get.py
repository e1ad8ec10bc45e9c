# dl2-case: label=ok world=2 category=store-wait
"""Correct twin: rank 1 sets the key before it enters the collective, so rank 0's
store.get returns and both ranks meet in the all_reduce."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    stats = torch.ones(4)
    if rank == 0:
        assert store.get("ready") == b"1"
        dist.all_reduce(stats)
    else:
        store.set("ready", "1")
        dist.all_reduce(stats)
    assert torch.equal(stats, torch.full((4,), 2.0)), stats
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
