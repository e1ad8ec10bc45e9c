"""Every collective, P2P form and object collective, store calls, then a DDP step, on 2
ranks.

Launched with torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
and no dl2 code: the bootstrap on PYTHONPATH records it.  Writes each rank's results to
$CASE_OUT/rank<R>.json so a run with and without recording can be compared.  Lines the
test looks for carry a ``# mark: NAME`` comment.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.nn.parallel import DistributedDataParallel


def collectives(rank: int, world: int, out: dict) -> None:
    t = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(t)  # mark: all_reduce
    out["all_reduce"] = t.tolist()
    m = torch.tensor([float(rank)])
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = m.tolist()
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=1)
    out["broadcast"] = b.tolist()
    r = torch.tensor([1.0, 2.0]) * (rank + 1)
    dist.reduce(r, dst=1, op=dist.ReduceOp.PRODUCT)
    out["reduce"] = r.tolist() if rank == 1 else None
    c = [torch.ones(2) * rank, torch.ones(3)]
    dist.all_reduce_coalesced(c)
    out["all_reduce_coalesced"] = [x.tolist() for x in c]
    gathered = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(gathered, torch.ones(2) * rank)
    out["all_gather"] = [x.tolist() for x in gathered]
    flat = torch.zeros(2 * world)
    dist.all_gather_into_tensor(flat, torch.ones(2) * rank)
    out["all_gather_into_tensor"] = flat.tolist()
    lists = [[torch.zeros(2)] for _ in range(world)]
    dist.all_gather_coalesced(lists, [torch.ones(2) * rank])
    out["all_gather_coalesced"] = [x[0].tolist() for x in lists]
    into = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.ones(2) * rank, into, dst=0)
    out["gather"] = [x.tolist() for x in into] if into else None
    chunk = torch.zeros(3)
    dist.scatter(chunk, [torch.ones(3) * i for i in range(world)] if rank == 0 else None, src=0)
    out["scatter"] = chunk.tolist()
    rs = torch.zeros(2)
    dist.reduce_scatter(rs, [torch.ones(2) * (i + rank) for i in range(world)])
    out["reduce_scatter"] = rs.tolist()
    rst = torch.zeros(2)
    dist.reduce_scatter_tensor(rst, torch.arange(2.0 * world) + rank)
    out["reduce_scatter_tensor"] = rst.tolist()
    a2a = [torch.zeros(2) for _ in range(world)]
    dist.all_to_all(a2a, [torch.ones(2) * (10 * rank + i) for i in range(world)])
    out["all_to_all"] = [x.tolist() for x in a2a]
    even = torch.zeros(2 * world)
    dist.all_to_all_single(even, torch.arange(2.0 * world) + 10 * rank)
    out["all_to_all_single"] = even.tolist()
    splits = [1, 2] if rank == 0 else [2, 1]  # rank 0 sends 1 row to 0, 2 rows to 1
    recv_splits = [1, 2] if rank == 0 else [2, 1]
    uneven = torch.zeros(3)
    dist.all_to_all_single(  # mark: uneven
        uneven,
        torch.arange(3.0) + 10 * rank,
        output_split_sizes=recv_splits,
        input_split_sizes=splits,
    )
    out["all_to_all_uneven"] = uneven.tolist()
    work = dist.all_reduce(torch.ones(1), async_op=True)
    work.wait()  # mark: async_wait
    dist.barrier()
    dist.monitored_barrier()
    ft = funcol.all_gather_tensor(torch.ones(2) * rank, 0, dist.group.WORLD)
    out["funcol_all_gather"] = ft.wait().tolist()  # mark: funcol_wait


def objects(rank: int, world: int, out: dict) -> None:
    everyone = [None] * world
    dist.all_gather_object(everyone, {"rank": rank})  # mark: all_gather_object
    out["all_gather_object"] = everyone
    items = [rank, "x"]
    dist.broadcast_object_list(items, src=0)
    out["broadcast_object_list"] = items
    into = [None] * world if rank == 0 else None
    dist.gather_object(rank * 7, into, dst=0)
    out["gather_object"] = into
    got = [None]
    dist.scatter_object_list(got, ["a", "b"] if rank == 0 else None, src=0)
    out["scatter_object_list"] = got
    if rank == 0:
        dist.send_object_list([1, 2], dst=1)
    else:
        objs = [None, None]
        dist.recv_object_list(objs, src=0)
        out["recv_object_list"] = objs


def point_to_point(rank: int, world: int, out: dict) -> None:
    peer = 1 - rank
    x = torch.zeros(2)
    if rank == 0:
        dist.send(torch.tensor([5.0, 6.0]), dst=1)  # mark: send
        dist.recv(x, src=1, tag=3)
    else:
        dist.recv(x, src=0)  # mark: recv
        dist.send(torch.tensor([7.0, 8.0]), dst=0, tag=3)
    out["send_recv"] = x.tolist()
    y = torch.zeros(2)
    req = dist.isend(torch.ones(2), dst=1) if rank == 0 else dist.irecv(y, src=0)
    req.wait()  # mark: isend_wait
    out["isend_irecv"] = y.tolist()
    incoming = torch.zeros(2)
    ops = [
        dist.P2POp(dist.isend, torch.ones(2) * rank, peer),
        dist.P2POp(dist.irecv, incoming, peer),
    ]
    for req in dist.batch_isend_irecv(ops):  # mark: batch
        req.wait()
    out["batch_isend_irecv"] = incoming.tolist()
    z = torch.zeros(1)
    if rank == 0:
        out["wildcard_src"] = dist.recv(z)  # mark: wildcard
        w = dist.irecv(z)
        w.wait()
        out["wildcard_irecv_src"] = w._source_rank()
    else:
        dist.send(torch.ones(1), dst=0)
        dist.send(torch.ones(1) * 2, dst=0)
    out["wildcard_value"] = z.tolist()


def subgroup(rank: int, out: dict) -> None:
    sub = dist.new_group([0])  # mark: new_group
    one = torch.ones(1)
    dist.all_reduce(one, group=sub)  # mark: nonmember
    out["subgroup_all_reduce"] = one.tolist()


def store_calls(rank: int, out: dict) -> None:
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        store.set("ready", "yes")  # mark: store_set
    out["store_get"] = store.get("ready").decode()  # mark: store_get
    store.wait(["ready"])
    out["store_check"] = store.check(["ready"])


def ddp_step(rank: int, out: dict) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)
    for _ in range(2):
        loss = ddp(torch.randn(4, 8)).square().sum()
        loss.backward()  # mark: backward
        opt.step()
        opt.zero_grad()
    out["ddp_params"] = [round(float(p.detach().sum()), 5) for p in model.parameters()]


def main() -> None:
    dist.init_process_group("gloo")  # mark: init
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {"backend": str(dist.get_backend())}
    collectives(rank, world, out)
    objects(rank, world, out)
    point_to_point(rank, world, out)
    subgroup(rank, out)
    store_calls(rank, out)
    ddp_step(rank, out)
    dist.destroy_process_group()
    with open(os.path.join(os.environ["CASE_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f, sort_keys=True)


if __name__ == "__main__":
    sys.exit(main())
