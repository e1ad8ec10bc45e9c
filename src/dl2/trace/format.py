"""The on-disk trace format at file level: per rank, a series of JSON Lines segments.

Each segment file starts with a header line; every later line is one record (both
described, written and read by :mod:`dl2.trace.schema`).  Records are appended with one
``os.write`` each, so a killed rank loses at most its last partial line, which the
reader reports as a truncation note rather than an error.  A malformed line before the
last one (a disk fault, a foreign write) is skipped with a note naming the file and
line: the rest of the trace is still read, and the analysis reports the run as
incomplete.

A rank's process writes segment 0, then, when a segment reaches its size, the next one
(named ``rank<r>.<pid>.s<k>.dl2.jsonl``), starting with a checkpoint of what came
before; the recorder deletes the oldest segments past those it keeps.  Read in order,
the segments are one trace (:func:`read_trace_stream`).

This module names the files and reads them.  The record decoder (msgspec) is imported
on first read, not here: the recorder, which names its files with
:func:`trace_file_name`, never loads it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dl2.errors import TraceFormatError
from dl2.trace.schema import FORMAT_VERSION
from dl2.trace.schema import MAGIC

if TYPE_CHECKING:
    from dl2.trace.schema.decode import Header
    from dl2.trace.schema.decode import Record
    from dl2.trace.schema.reader import SegmentDecoder

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "TRACE_SUFFIX",
    "RankTrace",
    "TraceReader",
    "parse_header",
    "read_trace_file",
    "read_trace_stream",
    "stream_of",
    "trace_file_name",
]

TRACE_SUFFIX = ".dl2.jsonl"
_NAME = re.compile(r"^(rank\d+\.\d+)(?:\.s(\d+))?" + re.escape(TRACE_SUFFIX) + "$")


def trace_file_name(rank: int, pid: int, segment: int = 0) -> str:
    """The file name of a segment of one rank's trace: sorts by rank, names its process
    (segment 0 has no segment number: a trace that never rotated is one plain file)."""
    base = f"rank{rank:05d}.{pid}"
    return f"{base}{TRACE_SUFFIX}" if not segment else f"{base}.s{segment:06d}{TRACE_SUFFIX}"


def stream_of(name: str) -> tuple[str, int]:
    """(the stream a trace file belongs to, its segment number) from its name; a file
    dl2 did not name is a stream of its own."""
    match = _NAME.match(name)
    if match is None:
        return name, 0
    return match.group(1), int(match.group(2) or 0)


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace (all its segments) as read back.

    Attributes:
        path: the first segment read.
        header: that segment's header (``header.segment`` > 0: the history before it
            was rotated away, and ``records`` starts with its checkpoint).
        records: every complete record after the header, in order.
        truncated: a sentence describing a partial last record, or None.
        skipped: (line number, note naming file and line) per corrupt record skipped
            before the last line.
        warnings: other notes (segments missing, records lost before a checkpoint).
        segments: every file read, in order.
    """

    path: str
    header: Header
    records: tuple[Record, ...]
    truncated: str | None = None
    skipped: tuple[tuple[int, str], ...] = ()
    warnings: tuple[str, ...] = ()
    segments: tuple[str, ...] = ()

    @property
    def rank(self) -> int:
        return self.header.rank

    @property
    def rotated(self) -> bool:
        """Whether the history before the first segment read is gone."""
        return self.header.segment > 0


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


class TraceReader:
    """Reads one trace file (one segment) incrementally, from its first byte on.

    Feed it the bytes that follow those it consumed (a live tailer feeds what was
    appended); it keeps the segment's tables between calls.

    Attributes:
        header: the header, once line 1 is complete.
        consumed: bytes consumed (complete lines; a partial or corrupt last line is
            left for the next feed).
        truncated: a sentence about a partial or corrupt last line, or None.
        skipped: (line number, note naming file and line) per corrupt line skipped
            in the middle.
        warnings: other notes (records a corrupt line lost, said by a checkpoint).
    """

    def __init__(self, path: str, calls: bool = False) -> None:
        self.path = path
        self.calls = calls  # blocking calls as (op, wait id) items: see SegmentDecoder
        self.header: Header | None = None
        self.consumed = 0
        self.truncated: str | None = None
        self.skipped: list[tuple[int, str]] = []
        self.warnings: list[str] = []
        self._lineno = 0  # lines consumed
        self._decoder: SegmentDecoder | None = None

    def feed(self, data: bytes) -> list[Record]:
        """The records of the complete lines of ``data``.

        Raises:
            TraceFormatError: a header that is not a dl2 trace's of this format version.
        """
        start = 0
        if self.header is None:
            from dl2.trace.schema.reader import SegmentDecoder  # msgspec: analysis side only

            newline = data.find(b"\n")
            if newline < 0:
                self.truncated = "truncated header" if data else None
                return []
            self.header = parse_header(data[:newline], self.path)
            self._decoder = SegmentDecoder(self.header, self.calls)
            self._lineno = 1
            start = newline + 1
            self.consumed += start
        decoder = self._decoder
        assert decoder is not None
        end = data.rfind(b"\n") + 1
        lines = data[start : end - 1].split(b"\n") if end > start else []
        partial = data[max(end, start) :]
        records, corrupt = decoder.decode(lines)
        count = len(lines)
        # A corrupt last line with nothing after it may be a record still being
        # written: it is left for the next feed, as a partial line is.
        held = bool(count and not partial and corrupt and corrupt[-1][0] == count - 1)
        if held:
            corrupt.pop()
            decoder.unskip()
        for index, item in corrupt:
            number = self._lineno + index + 1
            self.skipped.append((number, f"{self.path}:{number}: corrupt record skipped ({item})"))
        used = count - held
        if count:
            self.consumed += end - start - (len(lines[-1]) + 1 if held else 0)
        self._lineno += used
        if held:
            self.truncated = f"last record is corrupt (line {self._lineno + 1})"
        elif partial:
            self.truncated = (
                f"last record is truncated ({len(partial)} bytes at line {self._lineno + 1})"
            )
        else:
            self.truncated = None
        if decoder.notes:
            self.warnings.extend(f"{self.path}: {note}" for note in decoder.notes)
            decoder.notes.clear()
        return records

    def trace(self, records: Sequence[Record]) -> RankTrace:
        assert self.header is not None
        return RankTrace(
            path=self.path,
            header=self.header,
            records=tuple(records),
            truncated=self.truncated,
            skipped=tuple(self.skipped),
            warnings=tuple(self.warnings),
            segments=(self.path,),
        )


def read_trace_file(path: str | os.PathLike[str], limit: int | None = None) -> RankTrace:
    """Read one trace file (one segment), its first ``limit`` bytes if given.

    Raises:
        TraceFormatError: the file is empty, foreign, of another version, or its header
            is corrupt (corrupt records are skipped: see :attr:`RankTrace.skipped`).
    """
    name = str(path)
    try:
        with open(name, "rb") as handle:
            data = handle.read(-1 if limit is None else limit)
    except OSError as err:
        raise TraceFormatError(f"{name}: cannot read trace file: {err.strerror}") from None
    if not data:
        raise TraceFormatError(f"{name}: empty trace file")
    if b"\n" not in data:
        raise TraceFormatError(f"{name}: truncated header (the rank died while opening its trace)")
    reader = TraceReader(name)
    return reader.trace(reader.feed(data))


def read_trace_stream(
    paths: Sequence[str | os.PathLike[str]], limits: Mapping[str, int] | None = None
) -> RankTrace:
    """Read the segments of one rank's process as one trace (see :func:`join_segments`;
    ``limits``: file name -> the bytes of it to read, see
    :func:`dl2.trace.session.read_limits`).

    Raises:
        TraceFormatError: no segment could be read (the first error).
    """
    traces: list[RankTrace] = []
    errors: list[str] = []
    for path in paths:
        try:
            limit = None if limits is None else limits.get(Path(path).name)
            traces.append(read_trace_file(path, limit))
        except TraceFormatError as err:
            errors.append(str(err))
    if not traces:
        raise TraceFormatError(errors[0] if errors else "no trace file")
    return join_segments(traces, [f"skipped {e}" for e in errors])


def join_segments(segments: Sequence[RankTrace], warnings: Sequence[str] = ()) -> RankTrace:
    """One trace from the segments of one process, in any order.

    The first segment kept starts the trace (with its checkpoint, if it is not segment
    0); each next one continues it (its checkpoint, a repetition, is dropped).  Where a
    segment is missing, the trace restarts at the next segment's checkpoint.
    """
    from dl2.trace.schema.decode import CheckpointRecord

    ordered = sorted(segments, key=lambda s: s.header.segment)
    notes = list(warnings)
    start = 0
    for i in range(1, len(ordered)):
        before, after = ordered[i - 1].header.segment, ordered[i].header.segment
        if after != before + 1:
            notes.append(
                f"{ordered[i].path}: segment(s) {before + 1}..{after - 1} missing; "
                "reading from this segment's checkpoint"
            )
            start = i
    kept = ordered[start:]
    records: list[Record] = list(kept[0].records)
    for segment in kept[1:]:
        rest = segment.records
        if rest and isinstance(rest[0], CheckpointRecord):
            rest = rest[1:]
        records.extend(rest)
    for segment in kept[:-1]:
        if segment.truncated:
            notes.append(f"{segment.path}: {segment.truncated}")
    first = kept[0]
    if first.rotated and not (records and isinstance(records[0], CheckpointRecord)):
        notes.append(f"{first.path}: segment {first.header.segment} has no checkpoint")
    return RankTrace(
        path=first.path,
        header=first.header,
        records=tuple(records),
        truncated=kept[-1].truncated,
        skipped=tuple(line for s in kept for line in s.skipped),
        warnings=tuple(notes) + tuple(w for s in ordered for w in s.warnings),
        segments=tuple(s.path for s in kept),
    )
