# dl2-case: label=ok world=3 category=object-collective-subset
"""Correct twin: object collectives whose pickled sizes differ a lot between ranks
(torch exchanges the sizes first): broadcast_object_list, scatter_object_list,
gather_object and all_gather_object, all called by every rank."""

import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    cfg = [{"vocab": list(range(500))}] if rank == 1 else [None]
    dist.broadcast_object_list(cfg, src=1)
    assert len(cfg[0]["vocab"]) == 500
    mine = [None]
    dist.scatter_object_list(mine, ["x" * (10**i) for i in range(world)] if rank == 0 else None, src=0)
    assert len(mine[0]) == 10**rank
    out = [None] * world if rank == 2 else None
    dist.gather_object({"r": rank, "pad": "y" * (1000 * rank)}, out, dst=2)
    everyone = [None] * world
    dist.all_gather_object(everyone, list(range(rank * 100)))
    assert [len(e) for e in everyone] == [r * 100 for r in range(world)]
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
