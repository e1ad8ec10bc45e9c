"""The on-disk trace format: one append-only JSON Lines file per rank.

Line 1 is a header; every later line is one record, a JSON object whose ``"k"`` key
names its kind.  Records are appended with one ``os.write`` each, so a killed rank
loses at most its last partial line, which :func:`read_trace_file` detects.

Header (``k = "header"``)::

    magic      "dl2-trace"
    format     FORMAT_VERSION
    dl2        writer version
    rank       global rank;  world_size
    pid, host  the process that wrote the file
    t0         time.monotonic_ns() when the file was opened (record times use it)
    wall       time.time_ns() at the same moment (aligns ranks for display only)
    torch      torch.__version__;  backend: the inner backend ("gloo")
    argv       sys.argv of the rank
    emulate    present only when dl2 emulated other send semantics on gloo
               (``dl2 run --buffer-size``, ``dl2 replay``; see dl2.record.emulate):
               {"eager_bytes": sends of at most this many bytes were eager,
                "fused_batches": each batch_isend_irecv launched as one unit}

Records (times ``t`` are ``time.monotonic_ns()``; ids are per file, increasing):

``op``       a communication call on a process group, written *before* it is issued::

               id, t, tid (thread ident), gid (group name), seq (per-group index of this
               collective, or of this P2P op on its (peer, direction) channel; null for
               create_group),
               op      all_reduce | broadcast | reduce | all_gather | all_gather_into_tensor |
                       gather | scatter | reduce_scatter | reduce_scatter_tensor | all_to_all |
                       all_to_all_single | barrier | monitored_barrier |
                       all_reduce_coalesced | all_gather_coalesced |
                       all_gather_into_tensor_coalesced | reduce_scatter_tensor_coalesced |
                       send | recv | create_group
                       (the two *_tensor_coalesced ops are what _coalescing_manager and, in
                       torch 2.13, the functional collectives issue, even for one tensor)
               api     the torch.distributed function the user called (all_gather_object,
                       batch_isend_irecv, ...) or null when issued from C++ (DDP)
               peer    P2P: global rank of the other side; null for a wildcard recv
               root    broadcast/reduce/gather/scatter: global rank of the root
               tag     P2P tag;  redop: "sum", "max", ...;  dtype: "float32", ...
               count   elements of the input (per rank; summed over the tensors of list
                       and coalesced forms; for scatter, the output, as only the root has
                       an input); splits: all_to_all split sizes [input splits, output
                       splits], in elements, one per rank (even splits written out);
                       all_reduce_coalesced: [[elements of each tensor, in call order]]
               ranks   create_group: global ranks of the new group
               timeout monitored_barrier: its timeout in seconds (torch fills in the
                       group's default when the user gave none)
               async   true if the user asked for async_op / isend / irecv
               batch   ops issued by one batch_isend_irecv call (or coalescing block) share
                       this id (the id of the batch's first op); null otherwise
               eager   true for a send of at most ``emulate.eager_bytes`` bytes: it
                       completed for its rank when issued (the blocking call returned at
                       once, its work's wait too); gloo delivered a copy in the background
               deferred  true for an op of a batch under ``emulate.fused_batches``: issued
                       (its ``ret``) only when every op of its batch could be matched
               stack   [[file, line, function], ...] user frames, innermost first
             Fields that do not apply to an op are absent (a wildcard recv has "peer": null).

``ret``      the call returned: ``id``, ``t``; ``err`` (str) if it raised.  For an op
             this means *issued* (the work may still be pending); for a wait, *completed*.
             A wait's ``ret`` carries ``src``, the matched sender of a wildcard recv.
             A wait's ``ret`` may share the write of the next record, or be written by the
             watchdog up to one period (0.2 s) later; its ``t`` is when the wait returned.
``wait``     ``id``, ``t``, ``tid``, ``work`` (the op id waited on), ``stack``.
``done``     an async op was seen complete: ``id`` (the op id), ``t``, ``src`` (a wildcard
             recv only).
``newgroup`` a call of new_group by any rank, member or not: ``id``, ``t``, ``ranks``
             (null means all), ``gid`` (null for a non-member), ``stack``.
``nonmember`` a collective called on a group this rank is not a member of (torch skips it
             silently): ``t``, ``api``, ``stack``.
``state``    the watchdog's view while the rank is quiet: ``t``, ``pending`` (ids of
             issued ops not yet complete: async ops not seen done, and the blocking op a
             thread is waiting on), ``where`` ("backward", "comm", "python"), ``stack``
             (the thread that issued the last op, else the main thread; innermost first).
             ``where`` "poll": the rank keeps polling ``is_completed()`` on the works
             in ``pending`` (only those), ``stack`` is where it first polled them.
``end``      the rank is shutting down cleanly: ``t``, ``how`` ("exit" | "destroy").
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dl2.errors import TraceFormatError

MAGIC = "dl2-trace"

# History of FORMAT_VERSION:
#   1: first version (header + op/ret/wait/done/newgroup/nonmember/state/end records).
#      Later additions, optional and ignored by older readers: header "emulate", op
#      "eager" and "deferred", per-tensor "splits" of all_reduce_coalesced.
FORMAT_VERSION = 1

TRACE_SUFFIX = ".dl2.jsonl"


def trace_file_name(rank: int, pid: int) -> str:
    """The file name of one rank's trace: sorts by rank, names its process."""
    return f"rank{rank:05d}.{pid}{TRACE_SUFFIX}"


def encode(record: dict[str, Any]) -> bytes:
    """One record as a JSON line."""
    return (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace file as read back.

    Attributes:
        path: the file.
        header: the header record.
        records: every complete record after the header, in file order.
        truncated: a sentence describing a partial last record, or None.
    """

    path: str
    header: dict[str, Any]
    records: tuple[dict[str, Any], ...]
    truncated: str | None = None

    @property
    def rank(self) -> int:
        return int(self.header["rank"])


def _iter_lines(data: bytes) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line, ends with newline) for each line of the file."""
    start = 0
    lineno = 1
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            yield lineno, data[start:], False
            return
        yield lineno, data[start:end], True
        start = end + 1
        lineno += 1


def parse_header(line: bytes, path: str) -> dict[str, Any]:
    """Check and return the header line of a trace file."""
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise TraceFormatError(f"{path}: not a dl2 trace file (no dl2 header on line 1)")
    version = header.get("format")
    if version != FORMAT_VERSION:
        raise TraceFormatError(
            f"{path}: trace format version {version}, this dl2 reads version "
            f"{FORMAT_VERSION}; analyse it with the dl2 version that recorded it"
        )
    if not isinstance(header.get("rank"), int) or not isinstance(header.get("world_size"), int):
        raise TraceFormatError(f"{path}: header lacks rank or world_size")
    return header


def parse_records(
    data: bytes, path: str, first_lineno: int = 1
) -> tuple[list[dict[str, Any]], str | None, int]:
    """Parse complete record lines from ``data``.

    Returns the records, a truncation note for a partial last line (or None), and the
    number of bytes consumed (complete lines only), so a reader can resume there.
    A malformed line that is *not* the last one is corruption and raises.
    """
    records: list[dict[str, Any]] = []
    consumed = 0
    lines = list(_iter_lines(data))
    for index, (lineno, line, complete) in enumerate(lines):
        is_last = index == len(lines) - 1
        if not complete:
            note = (
                f"last record is truncated ({len(line)} bytes at line {lineno + first_lineno - 1})"
            )
            return records, note, consumed
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or "k" not in record:
            if is_last:
                note = f"last record is corrupt (line {lineno + first_lineno - 1})"
                return records, note, consumed
            raise TraceFormatError(
                f"{path}:{lineno + first_lineno - 1}: corrupt record in the middle of the trace"
            )
        records.append(record)
        consumed += len(line) + 1
    return records, None, consumed


def read_trace_file(path: str | os.PathLike[str]) -> RankTrace:
    """Read one rank's trace file.

    Raises:
        TraceFormatError: the file is empty, foreign, of another version, or corrupt
            before its last line.
    """
    name = str(path)
    try:
        data = Path(name).read_bytes()
    except OSError as err:
        raise TraceFormatError(f"{name}: cannot read trace file: {err.strerror}") from None
    if not data:
        raise TraceFormatError(f"{name}: empty trace file")
    newline = data.find(b"\n")
    if newline < 0:
        raise TraceFormatError(f"{name}: truncated header (the rank died while opening its trace)")
    header = parse_header(data[:newline], name)
    records, truncated, _ = parse_records(data[newline + 1 :], name, first_lineno=2)
    return RankTrace(path=name, header=header, records=tuple(records), truncated=truncated)
