"""The on-disk trace format at file level: one append-only JSON Lines file per rank.

Line 1 is a header, every later line one record (both described, written and read by
:mod:`dl2.trace.schema`).  Records are appended with one ``os.write`` each, so a killed
rank loses at most its last partial line, which :func:`parse_records` reports as a
truncation note rather than an error.  A malformed line before the last one (a disk
fault, a foreign write) is skipped with a note naming the file and line: the rest of
the trace is still read, and the analysis reports the run as incomplete.

This module names the files and reads them.  The record decoder (msgspec) is imported
on first read, not here: the recorder, which names its file with
:func:`trace_file_name`, never loads it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dl2.errors import TraceFormatError
from dl2.trace.schema import FORMAT_VERSION
from dl2.trace.schema import MAGIC

if TYPE_CHECKING:
    from dl2.trace.schema.decode import Header
    from dl2.trace.schema.decode import Record

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "TRACE_SUFFIX",
    "Parsed",
    "RankTrace",
    "parse_header",
    "parse_records",
    "read_trace_file",
    "trace_file_name",
]

TRACE_SUFFIX = ".dl2.jsonl"


def trace_file_name(rank: int, pid: int) -> str:
    """The file name of one rank's trace: sorts by rank, names its process."""
    return f"rank{rank:05d}.{pid}{TRACE_SUFFIX}"


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace file as read back.

    Attributes:
        path: the file.
        header: the header record.
        records: every complete record after the header, in file order.
        truncated: a sentence describing a partial last record, or None.
        skipped: (line number, note naming file and line) per corrupt record skipped
            before the last line.
    """

    path: str
    header: Header
    records: tuple[Record, ...]
    truncated: str | None = None
    skipped: tuple[tuple[int, str], ...] = ()

    @property
    def rank(self) -> int:
        return self.header.rank


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


def parse_header(line: bytes, path: str) -> Header:
    """Check and return the header line of a trace file.

    Raises:
        TraceFormatError: not a dl2 trace, another format version, or a corrupt header.
    """
    from dl2.trace.schema.decode import CorruptRecord
    from dl2.trace.schema.decode import decode_header

    try:
        return decode_header(line)
    except CorruptRecord as err:
        raise TraceFormatError(f"{path}: {err}") from None


@dataclass(frozen=True)
class Parsed:
    """Records parsed from a chunk of a trace file.

    Attributes:
        records: the records of its complete, readable lines, in order.
        truncated: a note on a partial or corrupt *last* line (the rank may still be
            writing it, or died while writing it), or None.
        consumed: bytes of the complete lines before any such last line: where a
            reader resumes.
        lines: how many lines those bytes hold (records and skipped lines).
        skipped: (line number, note naming file and line) per corrupt line before the last.
    """

    records: list[Record]
    truncated: str | None
    consumed: int
    lines: int
    skipped: list[tuple[int, str]]


def parse_records(data: bytes, path: str, first_lineno: int = 1) -> Parsed:
    """Parse complete record lines from ``data`` (a chunk that starts at a line).

    A corrupt line before the last one is skipped, with a note in ``skipped``; a
    partial or corrupt last line is left unconsumed, with a note in ``truncated``.
    """
    from dl2.trace.schema.decode import CorruptRecord
    from dl2.trace.schema.decode import decode_record

    records: list[Record] = []
    skipped: list[tuple[int, str]] = []
    consumed = 0
    lines = list(_iter_lines(data))
    for index, (lineno, line, complete) in enumerate(lines):
        number = lineno + first_lineno - 1
        done = lineno - 1
        if not complete:
            note = f"last record is truncated ({len(line)} bytes at line {number})"
            return Parsed(records, note, consumed, done, skipped)
        try:
            records.append(decode_record(line))
        except CorruptRecord as err:
            if index == len(lines) - 1:
                note = f"last record is corrupt (line {number})"
                return Parsed(records, note, consumed, done, skipped)
            skipped.append((number, f"{path}:{number}: corrupt record skipped ({err})"))
        consumed += len(line) + 1
    return Parsed(records, None, consumed, len(lines), skipped)


def read_trace_file(path: str | os.PathLike[str]) -> RankTrace:
    """Read one rank's trace file.

    Raises:
        TraceFormatError: the file is empty, foreign, of another version, or its header
            is corrupt (corrupt records are skipped: see :attr:`RankTrace.skipped`).
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
    parsed = parse_records(data[newline + 1 :], name, first_lineno=2)
    return RankTrace(
        path=name,
        header=header,
        records=tuple(parsed.records),
        truncated=parsed.truncated,
        skipped=tuple(parsed.skipped),
    )
