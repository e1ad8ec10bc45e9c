"""The replay worker: one rank of ``dl2 replay``, re-executing a plan's communication.

Run as ``python .../dl2/replay/worker.py PLAN.json`` by :mod:`dl2.replay.runner`, under
``dl2 run``'s machinery (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT`` in the
environment, the recorder injected by the bootstrap, send semantics emulated through
``DL2_BUFFER_SIZE`` / ``DL2_FUSED_BATCHES``).  It initialises gloo, creates every group of
the plan, issues its rank's ops on zero-filled tensors of the recorded dtype and size
(no model, no data), waits where the plan says, ends with a barrier on the world group,
and destroys the default group.

Original source lines.  Each op is issued through small functions compiled under the
*original* file names and line numbers, one per recorded user frame (innermost the
call itself), so the recorder sees and writes the recorded stack: reports on a replay
name the user's ``file:line``, not this module (whose frames the recorder skips, as it
skips all of dl2).

Ops are issued through the torch.distributed API named by the recorded op: the
``*_coalesced`` forms that ``_coalescing_manager`` and the functional collectives issue
are replayed as their single-tensor op with the recorded total count, and an
``all_reduce_coalesced`` with its recorded per-tensor sizes.

The final barrier keeps a rank that has finished its program reachable while others
still run theirs: without it, gloo turns a rank waiting on a finished one into a
connection error rather than the hang the original backend would show.  It is issued
from the pseudo-location ``<dl2 replay>:1 (end of program)``.
"""

from __future__ import annotations

import os
import sys

# Run as a script, Python puts this file's directory first on sys.path: take it off so
# that its sibling modules cannot shadow top-level ones.
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.path.dirname(
    os.path.abspath(__file__)
):
    sys.path.pop(0)

import functools
import json
from collections.abc import Callable
from typing import Any

from dl2.replay.plan import PlanOp
from dl2.replay.plan import ReplayPlan
from dl2.replay.plan import plan_from_json

#: The pseudo source location of the final barrier.
END_FILE = "<dl2 replay>"
END_FUNCTION = "end_of_program"

_CALLERS: dict[tuple[str, int, str], Callable[..., Any]] = {}


def caller_at(file: str, line: int, function: str) -> Callable[..., Any]:
    """A function whose frame reads as ``function`` at ``file:line`` and that calls its
    first argument with the rest."""
    key = (file, line, function)
    made = _CALLERS.get(key)
    if made is None:
        padding = "\n" * (max(line, 1) - 1)
        source = f"{padding}def _dl2_at(__dl2_call, *a, **k): return __dl2_call(*a, **k)\n"
        namespace: dict[str, Any] = {}
        exec(compile(source, file, "exec"), namespace)
        made = namespace["_dl2_at"]
        made.__code__ = made.__code__.replace(co_name=function, co_qualname=function)
        _CALLERS[key] = made
    return made


def from_stack(
    stack: tuple[tuple[str, int, str], ...], call: Callable[..., Any]
) -> Callable[..., Any]:
    """``call`` wrapped so that it runs under the recorded frames (innermost first)."""
    for file, line, function in stack:
        call = functools.partial(caller_at(file, line, function), call)
    return call


class Worker:
    """Executes one rank's plan.

    Args:
        plan: the whole plan.
        rank: this process's global rank.
    """

    def __init__(self, plan: ReplayPlan, rank: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        self.plan = plan
        self.rank = rank
        self.groups: dict[str, Any] = {}
        self.works: dict[int, Any] = {}
        self.kept: list[Any] = []  # async works never waited on (kept alive)

    # -- set-up ----------------------------------------------------------------------

    def create_groups(self) -> None:
        dist = self.dist
        self.groups[self.plan.default_gid] = None  # the default group
        for group in self.plan.groups:
            self.groups[group.gid] = dist.new_group(ranks=list(group.ranks))

    def group(self, op: PlanOp) -> Any:
        return self.groups[op.gid]

    def group_size(self, op: PlanOp) -> int:
        group = self.groups[op.gid]
        return int(self.dist.get_world_size(group))

    # -- tensors ---------------------------------------------------------------------

    def zeros(self, op: PlanOp, count: int | None = None) -> Any:
        torch = self.torch
        dtype = getattr(torch, op.dtype, None)
        if not isinstance(dtype, torch.dtype):
            dtype = torch.uint8
        return torch.zeros(op.count if count is None else count, dtype=dtype)

    def p2p_call(self, name: str, asynchronous: bool) -> Callable[..., Any]:
        """``send``/``recv``, or ``isend``/``irecv`` when ``asynchronous``."""
        call: Callable[..., Any] = getattr(self.dist, ("i" if asynchronous else "") + name)
        return call

    def redop(self, op: PlanOp) -> Any:
        name = (op.redop or "sum").upper()
        return getattr(self.dist.ReduceOp, name, self.dist.ReduceOp.SUM)

    # -- issuing ---------------------------------------------------------------------

    def run(self) -> None:
        rank_plan = self.plan.rank_plan(self.rank)
        ops = rank_plan.ops
        steps = rank_plan.steps
        i = 0
        while i < len(steps):
            kind, index = steps[i]
            if kind == "wait":
                work = self.works.pop(index, None)
                if work is not None:
                    from_stack(ops[index].stack, work.wait)()
                i += 1
                continue
            op = ops[index]
            if op.batch is not None and op.op in ("send", "recv"):
                batch = [index]
                while (
                    i + len(batch) < len(steps)
                    and steps[i + len(batch)][0] == "op"
                    and ops[steps[i + len(batch)][1]].batch == op.batch
                ):
                    batch.append(steps[i + len(batch)][1])
                self.issue_batch([ops[j] for j in batch], batch)
                i += len(batch)
                continue
            work = from_stack(op.stack, functools.partial(self.issue, op))()
            if op.is_async and work is not None:
                self.works[index] = work
            i += 1
        self.kept.extend(self.works.values())  # never waited on in the recorded run
        self.works.clear()

    def issue_batch(self, ops: list[PlanOp], indexes: list[int]) -> None:
        dist = self.dist
        p2p = [
            dist.P2POp(
                self.p2p_call(op.op, asynchronous=True),
                self.zeros(op),
                op.peer,
                self.group(op),
                op.tag,
            )
            for op in ops
        ]
        works = from_stack(ops[0].stack, dist.batch_isend_irecv)(p2p)
        for index, work in zip(indexes, works, strict=False):
            self.works[index] = work

    def issue(self, op: PlanOp) -> Any:
        """Issue one op from the current frame (the caller put the recorded ones above)."""
        dist = self.dist
        group = self.group(op)
        asynchronous = op.is_async
        name = op.op
        if name in ("send", "recv"):
            call = self.p2p_call(name, asynchronous)
            work = call(self.zeros(op), op.peer, group=group, tag=op.tag)
            return work if asynchronous else None
        if name == "all_reduce":
            return dist.all_reduce(
                self.zeros(op), op=self.redop(op), group=group, async_op=asynchronous
            )
        if name == "all_reduce_coalesced":
            sizes = list(op.splits[0]) if op.splits else [op.count]
            tensors = [self.zeros(op, n) for n in sizes]
            return dist.all_reduce_coalesced(
                tensors, op=self.redop(op), group=group, async_op=asynchronous
            )
        if name == "broadcast":
            return dist.broadcast(self.zeros(op), op.root, group=group, async_op=asynchronous)
        if name == "reduce":
            return dist.reduce(
                self.zeros(op), op.root, op=self.redop(op), group=group, async_op=asynchronous
            )
        size = self.group_size(op)
        if name in ("all_gather", "all_gather_coalesced"):
            outputs = [self.zeros(op) for _ in range(size)]
            return dist.all_gather(outputs, self.zeros(op), group=group, async_op=asynchronous)
        if name in ("all_gather_into_tensor", "all_gather_into_tensor_coalesced"):
            output = self.zeros(op, op.count * size)
            return dist.all_gather_into_tensor(
                output, self.zeros(op), group=group, async_op=asynchronous
            )
        if name == "gather":
            gather_list = [self.zeros(op) for _ in range(size)] if op.root == self.rank else None
            return dist.gather(
                self.zeros(op), gather_list, op.root, group=group, async_op=asynchronous
            )
        if name == "scatter":
            scatter_list = [self.zeros(op) for _ in range(size)] if op.root == self.rank else None
            return dist.scatter(
                self.zeros(op), scatter_list, op.root, group=group, async_op=asynchronous
            )
        if name == "reduce_scatter":
            chunk = op.count // max(size, 1)
            inputs = [self.zeros(op, chunk) for _ in range(size)]
            return dist.reduce_scatter(
                self.zeros(op, chunk),
                inputs,
                op=self.redop(op),
                group=group,
                async_op=asynchronous,
            )
        if name in ("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
            chunk = op.count // max(size, 1)
            return dist.reduce_scatter_tensor(
                self.zeros(op, chunk),
                self.zeros(op, chunk * size),
                op=self.redop(op),
                group=group,
                async_op=asynchronous,
            )
        if name == "all_to_all":
            ins, outs = op.splits if op.splits else ([op.count // size] * size,) * 2
            return dist.all_to_all(
                [self.zeros(op, n) for n in outs],
                [self.zeros(op, n) for n in ins],
                group=group,
                async_op=asynchronous,
            )
        if name == "all_to_all_single":
            ins, outs = op.splits if op.splits else ([op.count // size] * size,) * 2
            return dist.all_to_all_single(
                self.zeros(op, sum(outs)),
                self.zeros(op, sum(ins)),
                output_split_sizes=list(outs),
                input_split_sizes=list(ins),
                group=group,
                async_op=asynchronous,
            )
        if name == "barrier":
            return dist.barrier(group=group, async_op=asynchronous)
        if name == "monitored_barrier":
            dist.monitored_barrier(group=group)
            return None
        raise ValueError(f"cannot replay {name}")

    def finish(self) -> None:
        """The final barrier (see the module docstring), then the group's destruction."""
        from_stack(((END_FILE, 1, END_FUNCTION),), self.dist.barrier)()
        self.dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: worker.py PLAN.json", file=sys.stderr)
        return 2
    with open(args[0]) as handle:
        plan = plan_from_json(json.load(handle))
    import torch.distributed as dist

    dist.init_process_group("gloo")
    worker = Worker(plan, dist.get_rank())
    worker.create_groups()
    worker.run()
    worker.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
