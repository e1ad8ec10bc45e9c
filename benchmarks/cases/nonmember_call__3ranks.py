# dl2-case: label=defect world=3 category=nonmember-call
# dl2-expect: ranks=2
"""Rank 2 calls a collective on a group it is not a member of.

torch returns from the call at once without communicating (it only emits a
UserWarning), so the job completes, but rank 2 believes it took part in the
all_reduce and its tensor is left unreduced.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair = dist.new_group([0, 1])
    t = torch.full((4,), float(rank))
    dist.all_reduce(t, group=pair)  # dl2: culprit
    print(f"rank {rank}: all_reduce -> {t.tolist()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
