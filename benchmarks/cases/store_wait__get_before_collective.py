# dl2-case: label=deadlock world=2 category=store-wait
# dl2-expect: ranks=0,1
"""A key set too late: rank 0 waits in store.get for a key rank 1 sets only after a
collective that rank 0 reaches only once it has the key.

Rank 0 blocks in ``store.get("ready")`` (it waits for rank 1 to announce its data);
rank 1 first joins an all_reduce, which waits for rank 0, and would set "ready" only
after it. The get waits for the store's timeout (30 min for the default store), the
all_reduce forever.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    stats = torch.ones(4)
    if rank == 0:
        store.get("ready")  # dl2: culprit
        dist.all_reduce(stats)
    else:
        dist.all_reduce(stats)  # dl2: culprit
        store.set("ready", "1")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
