# dl2-case: label=deadlock world=2 category=store-wait
# dl2-expect: ranks=0,1
"""A rank that returns early without setting the key another rank waits for.

Rank 0 waits in ``store.get("result")`` for rank 1's result; rank 1 finds nothing to
report and returns without setting it. Unlike a gloo op, whose connection to the
exited rank breaks, the get waits on the store that rank 0 itself serves: it hangs
until the store's timeout (30 min for the default store).
"""

import torch
import torch.distributed as dist


def evaluate():
    scores = torch.zeros(4)
    return None if scores.sum() == 0 else scores


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        print("result:", store.get("result"))  # dl2: culprit
    else:
        scores = evaluate()
        if scores is None:
            return  # nothing to report
        store.set("result", str(scores.tolist()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
