# dl2-case: label=deadlock world=3 category=object-collective-subset
# dl2-expect: ranks=0,1,2
"""Rank 0 broadcasts the run config with broadcast_object_list, but rank 2 was given
the config on its command line and skips the broadcast; it waits in the barrier."""

import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = [{"lr": 0.1, "steps": 3}] if rank == 0 else [None]
    if rank != 2:
        dist.broadcast_object_list(config, src=0)  # dl2: culprit
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
