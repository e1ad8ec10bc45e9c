"""Synthetic run directories for the scale benchmark: many ranks, long histories, a
deadlock at the end.

Every record is written by the recorder's own stream encoder
(:class:`dl2.trace.schema.stream.StreamEncoder`, rank by rank, op by op, as a rank
would write it: interned stacks and descriptions, held-back returns), the one place
that knows the wire format; nothing here spells a field or a line.

Each rank's trace is init_process_group, then the same history of blocking
``all_reduce`` calls; only the last call differs:

* ranks 0 and 1: ``send`` to each other (blocked, a send/send cycle) at ``SEND_LINE``;
* every other rank: a ``barrier`` on the world group (blocked, as ranks 0 and 1 never
  reach it) at ``BARRIER_LINE``.

One segment per rank (``dl2 run --keep all``): the analysis reads the whole history.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dl2.trace.format import trace_file_name
from dl2.trace.schema import encode
from dl2.trace.schema.stream import StackTable
from dl2.trace.schema.stream import StreamEncoder

#: The (made-up) user script the generated stacks point into, and its lines.
FILE = "/home/user/project/train.py"
STEP_LINE = 21  # the history's all_reduce, in step()
LOOP_LINE = 40  # the call of step() in <module>
SEND_LINE = 44  # ranks 0 and 1: send to each other (the cycle)
BARRIER_LINE = 46  # every other rank: the barrier ranks 0 and 1 never reach
REDUCE_LINE = 48  # "split" ending: the lower half's all_reduce where the upper half barriers
TID = 140000000000001
GID = "0"
#: nanoseconds between the records of one blocking call, and between calls
ISSUE_NS, WAIT_NS, STEP_NS = 20_000, 230_000, 250_000
T_START = 1_000_000_000

#: typed records of one blocking call (op, ret, wait, the wait's ret), of init
#: (create_group and its ret) and of the last call (op, ret, wait: it never returns)
RECORDS_PER_CALL, INIT_RECORDS, TAIL_RECORDS = 4, 2, 3
#: bytes handed to the file at once
FLUSH_BYTES = 1 << 20


def _frames(line: int) -> list[tuple[str, int, str]]:
    """The stack of a call at ``line`` of the script, called from ``step()``."""
    return [(FILE, line, "step"), (FILE, LOOP_LINE, "<module>")]


def record_count(world: int, ops: int) -> int:
    """Records (headers not counted) in a run directory of ``world`` ranks x ``ops``."""
    return world * (INIT_RECORDS + RECORDS_PER_CALL * ops + TAIL_RECORDS)


#: how a run ends: "cycle" (ranks 0 and 1 send to each other, the others wait in a
#: barrier) or "split" (the lower half of the ranks calls all_reduce at ``REDUCE_LINE``,
#: the upper half barrier at ``BARRIER_LINE``, at the same position of the world group:
#: each half waits on the other, W/2 ranks on W/2)
ENDINGS = ("cycle", "split")


def write_rank(out: object, rank: int, world: int, ops: int, ending: str = "cycle") -> None:
    """Write rank ``rank``'s trace (after its header) to ``out`` (a binary file)."""
    chunks: list[bytes] = []
    size = 0

    def sink(data: bytes) -> None:
        nonlocal size
        chunks.append(data)
        size += len(data)
        if size >= FLUSH_BYTES:
            out.writelines(chunks)  # type: ignore[attr-defined]
            chunks.clear()
            size = 0

    stacks = StackTable()
    enc = StreamEncoder(rank, 0, stacks, sink)
    gid_json = encode.json_str(GID)
    init = stacks.intern(encode.stack_of([(FILE, 12, "<module>")]))
    ranks = list(range(world))
    t = T_START
    enc.op(1, t, TID, GID, gid_json, None, "create_group", "init_process_group",
           encode.ranks_field(ranks), False, init, ranks=ranks)  # fmt: skip
    enc.ret(1, t + ISSUE_NS)
    step = stacks.intern(encode.stack_of(_frames(STEP_LINE)))
    fields = encode.op_fields(redop="sum", dtype="float32", count=4)
    oid = 2
    for seq in range(ops):
        t += STEP_NS
        enc.op(oid, t, TID, GID, gid_json, seq, "all_reduce", "all_reduce", fields, False, step)
        enc.hold_issued_wait(oid, oid + 1, t + ISSUE_NS, TID, step)
        enc.hold_ret(oid + 1, t + WAIT_NS)
        oid += 2
    t += STEP_NS
    if ending == "split" and rank < world // 2:
        sid = stacks.intern(encode.stack_of(_frames(REDUCE_LINE)))
        enc.op(oid, t, TID, GID, gid_json, ops, "all_reduce", "all_reduce", fields, False, sid)
    elif ending == "split":
        sid = stacks.intern(encode.stack_of(_frames(BARRIER_LINE)))
        enc.op(oid, t, TID, GID, gid_json, ops, "barrier", "barrier", "", False, sid)
    elif rank in (0, 1):
        sid = stacks.intern(encode.stack_of(_frames(SEND_LINE)))
        fields = encode.op_fields(peer=1 - rank, tag=0, dtype="float32", count=8)
        enc.op(oid, t, TID, GID, gid_json, 0, "send", "send", fields, False, sid, peer=1 - rank)
    else:
        sid = stacks.intern(encode.stack_of(_frames(BARRIER_LINE)))
        enc.op(oid, t, TID, GID, gid_json, ops, "barrier", "barrier", "", False, sid)
    enc.hold_issued_wait(oid, oid + 1, t + ISSUE_NS, TID, sid)
    enc.flush()
    out.writelines(chunks)  # type: ignore[attr-defined]


def header(rank: int, world: int) -> str:
    return encode.header_line(
        rank=rank,
        world_size=world,
        pid=100_000 + rank,
        host="synthetic",
        t0=0,
        wall=1_800_000_000_000_000_000,
        dl2="scale-benchmark",
        torch="2.13.0+cpu",
        backend="gloo",
        argv=[FILE],
    )


@dataclass
class RunDir:
    """A generated run directory.

    Attributes:
        path: the directory.
        world: ranks.
        ops: history ops per rank (before the last call).
        records: records in all files (headers not counted).
        bytes: bytes of all files.
        rank0_bytes: the size of rank 0's file.
    """

    path: Path
    world: int
    ops: int
    records: int
    bytes: int
    rank0_bytes: int


def write_run_dir(directory: Path, world: int, ops: int, ending: str = "cycle") -> RunDir:
    """Write ``world`` rank traces of ``ops`` all_reduces each, ending in the deadlock
    ``ending`` (see :data:`ENDINGS`; ``world`` >= 2)."""
    if world < 2:
        raise ValueError("the deadlock needs 2 ranks")
    if ending not in ENDINGS:
        raise ValueError(f"unknown ending {ending!r}")
    directory.mkdir(parents=True, exist_ok=True)
    total = rank0 = 0
    for rank in range(world):
        path = directory / trace_file_name(rank, 100_000 + rank)
        with path.open("wb") as out:
            out.write(header(rank, world).encode())
            write_rank(out, rank, world, ops, ending)
        size = os.path.getsize(path)
        total += size
        if rank == 0:
            rank0 = size
    return RunDir(directory, world, ops, record_count(world, ops), total, rank0)
