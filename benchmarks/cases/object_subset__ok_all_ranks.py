# dl2-case: label=ok world=2 category=object-collective-subset
"""Correct twin: every rank calls all_gather_object, only rank 0 prints."""

import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    stats = {"rank": rank, "loss": 0.5}
    gathered = [None] * world
    dist.all_gather_object(gathered, stats)
    assert [s["rank"] for s in gathered] == list(range(world)), gathered
    if rank == 0:
        print(gathered)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
