"""Synthetic run directories for the scale benchmark: many ranks, long histories, a
deadlock at the end.

Every record is written by the recorder's own encoders (:mod:`dl2.trace.schema.encode`),
the one place that knows the wire format; nothing here spells a field.  For speed, the
records of the repeated op (a blocking ``all_reduce``: its ``op``, ``ret`` + ``wait`` and
the wait's ``ret``, as the recorder writes them) are encoded once with sentinel numbers
for the id, time and sequence number, turned into a template, and checked against the
encoder on a few real values; only when the template reproduces the encoder's output
exactly is it used, otherwise every op is encoded one by one (slow but always right).
A format change that keeps the encoder's functions therefore needs no change here.

Each rank's trace is the same history (records of different ranks may share ids and
times: each file has its own clock and ids), so it is generated once per run directory
and written after each rank's own header; only the last calls differ:

* ranks 0 and 1: ``send`` to each other (blocked, a send/send cycle) at ``SEND_LINE``;
* every other rank: a ``barrier`` on the world group (blocked, as ranks 0 and 1 never
  reach it) at ``BARRIER_LINE``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dl2.trace.format import trace_file_name
from dl2.trace.schema import encode

#: The (made-up) user script the generated stacks point into, and its lines.
FILE = "/home/user/project/train.py"
STEP_LINE = 21  # the history's all_reduce, in step()
LOOP_LINE = 40  # the call of step() in <module>
SEND_LINE = 44  # ranks 0 and 1: send to each other (the cycle)
BARRIER_LINE = 46  # every other rank: the barrier ranks 0 and 1 never reach
TID = 140000000000001
GID = "0"
#: nanoseconds between the records of one blocking call, and between calls
ISSUE_NS, WAIT_NS, STEP_NS = 20_000, 230_000, 250_000
T_START = 1_000_000_000

# Sentinels: numbers no real field of the template holds (checked), one per value the
# template substitutes; an op's wait has id ``oid + 1`` and times ``t + ISSUE_NS`` and
# ``t + WAIT_NS``.
_S_OID, _S_T, _S_SEQ = 7_391_000_001, 8_627_000_000_001, 9_143_000_001


def _stack(line: int) -> str:
    """The stack of a call at ``line`` of the script, called from ``step()``."""
    return encode.stack_of([(FILE, line, "step"), (FILE, LOOP_LINE, "<module>")])


_HISTORY_STACK = _stack(STEP_LINE)
_GID_JSON = encode.json_str(GID)


def blocking_call(oid: int, t: int, seq: int) -> str:
    """The records of one blocking, completed ``all_reduce`` (4 elements, sum) on the
    world group, as the recorder writes them: op, ret + wait, the wait's ret."""
    fields = encode.op_fields(redop="sum", dtype="float32", count=4)
    return (
        encode.op_line(
            oid, t, TID, _GID_JSON, seq, "all_reduce", "all_reduce", fields, False, _HISTORY_STACK
        )
        + encode.issued_then_wait_lines(oid, oid + 1, t + ISSUE_NS, TID, _HISTORY_STACK)
        + encode.ret_line(oid + 1, t + WAIT_NS)
    )


#: records and ids one blocking call writes
RECORDS_PER_CALL = 4
IDS_PER_CALL = 2


def _template(encoder: Callable[[int, int, int], str]) -> Callable[[int, int, int], str] | None:
    """A fast equivalent of ``encoder(oid, t, seq)``, or None if the encoded line does
    not carry these numbers as plain decimals (then the caller encodes op by op)."""
    sample = encoder(_S_OID, _S_T, _S_SEQ)
    values = {
        str(_S_OID): "{0}",
        str(_S_OID + 1): "{1}",
        str(_S_T): "{2}",
        str(_S_T + ISSUE_NS): "{3}",
        str(_S_T + WAIT_NS): "{4}",
        str(_S_SEQ): "{5}",
    }
    pattern = re.compile("|".join(sorted(values, key=len, reverse=True)))
    escaped = sample.replace("{", "{{").replace("}", "}}")
    fmt = pattern.sub(lambda m: values[m.group(0)], escaped)
    render = fmt.format

    def fast(oid: int, t: int, seq: int) -> str:
        return render(oid, oid + 1, t, t + ISSUE_NS, t + WAIT_NS, seq)

    probes = [(2, T_START, 0), (123_457, 98_765_432_101, 4_242), (10**9 + 3, 10**15 + 7, 10**6)]
    if all(fast(*probe) == encoder(*probe) for probe in probes):
        return fast
    return None


@dataclass
class History:
    """The shared body of every rank's trace: init, then ``ops`` blocking all_reduces.

    Attributes:
        chunks: the encoded records (after the header, before each rank's last call).
        records: how many records ``data`` holds.
        next_id: the next record id.
        next_t: the time of the next record.
        templated: True if the fast template was used.
    """

    chunks: list[bytes]
    records: int
    next_id: int
    next_t: int
    templated: bool


def history(world: int, ops: int) -> History:
    """init_process_group (a ``create_group`` of the world and its ret), then ``ops``
    blocking all_reduces."""
    init_stack = encode.stack_of([(FILE, 12, "<module>")])
    head = [
        encode.op_line(
            1,
            T_START,
            TID,
            _GID_JSON,
            None,
            "create_group",
            "init_process_group",
            encode.ranks_field(list(range(world))),
            False,
            init_stack,
        ),
        encode.ret_line(1, T_START + ISSUE_NS),
    ]
    chunks = ["".join(head).encode()]
    fast = _template(blocking_call)
    call = fast or blocking_call
    oid, t = 2, T_START + STEP_NS
    chunk: list[str] = []
    for seq in range(ops):
        chunk.append(call(oid, t, seq))
        oid += IDS_PER_CALL
        t += STEP_NS
        if len(chunk) >= 16384:
            chunks.append("".join(chunk).encode())
            chunk = []
    chunks.append("".join(chunk).encode())
    return History(
        chunks=chunks,
        records=2 + RECORDS_PER_CALL * ops,
        next_id=oid,
        next_t=t,
        templated=fast is not None,
    )


def record_count(world: int, ops: int) -> int:
    """Records (headers not counted) in a run directory of ``world`` ranks x ``ops``."""
    return world * (2 + RECORDS_PER_CALL * ops + 3)


def last_call(rank: int, world: int, body: History, seq: int) -> tuple[str, int]:
    """The call ``rank`` blocks in forever, issued and waited on, never returning, and its
    record count: ranks 0 and 1 send to each other, the others enter a barrier (the
    ``seq``-th collective of the world group, which ranks 0 and 1 never call)."""
    oid, t = body.next_id, body.next_t
    if rank in (0, 1):
        fields = encode.op_fields(peer=1 - rank, tag=0, dtype="float32", count=8)
        stack, op, group_seq = _stack(SEND_LINE), "send", 0
    else:
        fields, stack, op, group_seq = "", _stack(BARRIER_LINE), "barrier", seq
    line = encode.op_line(oid, t, TID, _GID_JSON, group_seq, op, op, fields, False, stack)
    return line + encode.issued_then_wait_lines(oid, oid + 1, t + ISSUE_NS, TID, stack), 3


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
        templated: the fast template was used.
    """

    path: Path
    world: int
    ops: int
    records: int
    bytes: int
    rank0_bytes: int
    templated: bool


def write_run_dir(directory: Path, world: int, ops: int) -> RunDir:
    """Write ``world`` rank traces of ``ops`` all_reduces each, ending in the deadlock
    (``world`` >= 2)."""
    if world < 2:
        raise ValueError("the send/send cycle needs 2 ranks")
    directory.mkdir(parents=True, exist_ok=True)
    body = history(world, ops)
    records = total = rank0 = 0
    for rank in range(world):
        tail, tail_records = last_call(rank, world, body, ops)
        path = directory / trace_file_name(rank, 100_000 + rank)
        with path.open("wb") as out:
            out.write(header(rank, world).encode())
            out.writelines(body.chunks)
            out.write(tail.encode())
        records += body.records + tail_records
        size = os.path.getsize(path)
        total += size
        if rank == 0:
            rank0 = size
    return RunDir(directory, world, ops, records, total, rank0, body.templated)
