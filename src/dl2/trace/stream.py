"""Reading a run directory chunk by chunk, for a reader that keeps no records itself.

:func:`stream_session` reads the trace files of a run directory round-robin, one chunk
of each in turn, and hands each chunk's complete records to a ``sink`` (the incremental
model): no more than a chunk per file is held at once, and the ranks advance together,
so that the sink can fold what all of them finished.  It returns the session as
:func:`dl2.trace.session.load_session` would, with the traces' headers and truncation
notes but no records (the sink has them).

What :func:`~dl2.trace.session.load_session` does, this does too: a file that is not a
readable trace (empty, foreign, another version, corrupt before its last line) is
skipped with a warning, and when a rank has several files the newest is its own (a
skipped newest one gives way to the next).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

from dl2.errors import NoDataError
from dl2.errors import TraceFormatError
from dl2.trace.format import TRACE_SUFFIX
from dl2.trace.format import RankTrace
from dl2.trace.format import parse_header
from dl2.trace.format import parse_records
from dl2.trace.schema.decode import Header
from dl2.trace.schema.decode import Record
from dl2.trace.session import Session
from dl2.trace.session import build_session
from dl2.trace.session import discover_trace_files
from dl2.trace.session import read_run_meta
from dl2.trace.session import run_ending
from dl2.trace.session import run_states

#: bytes read of one file at a time, at most
CHUNK_BYTES = 1 << 20
#: bytes read of all files in one round: many files are read in smaller chunks, so that
#: the ranks still advance together (and the sink can fold what they all finished)
ROUND_BYTES = 16 << 20
#: bytes read of one file at a time, at least (unless ``chunk_bytes`` is smaller)
MIN_CHUNK_BYTES = 4 << 10

#: takes (file, its header, new records, truncation note once the file is read through)
Sink = Callable[[str, Header, Sequence[Record], str | None], None]


class _Reader:
    """One trace file, read a chunk at a time after its header."""

    def __init__(self, path: Path) -> None:
        self.name = str(path)
        try:
            with open(path, "rb") as handle:
                first = handle.readline()
                self.offset = handle.tell()
        except OSError as err:
            raise TraceFormatError(f"{self.name}: cannot read trace file: {err.strerror}") from None
        if not first.endswith(b"\n"):
            raise TraceFormatError(
                f"{self.name}: empty trace file"
                if not first
                else f"{self.name}: truncated header (the rank died while opening its trace)"
            )
        self.header: Header = parse_header(first[:-1], self.name)
        self.lineno = 2  # of the first line not parsed yet
        self.rest = b""  # bytes read, not parsed yet (a partial or corrupt last line)
        self.truncated: str | None = None
        self.skipped: list[tuple[int, str]] = []
        self.done = False

    def read(self, size: int) -> list[Record]:
        """The complete records of the next chunk (the note on a partial last line is
        set once the file is read through; corrupt lines before it are skipped).

        Raises:
            TraceFormatError: the file cannot be read.
        """
        try:
            with open(self.name, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read(size)
        except OSError as err:
            raise TraceFormatError(f"{self.name}: cannot read trace file: {err.strerror}") from None
        self.offset += len(data)
        self.done = not data
        if self.done and not self.rest:
            return []
        parsed = parse_records(self.rest + data, self.name, self.lineno)
        self.rest = (self.rest + data)[parsed.consumed :]
        self.lineno += parsed.lines
        self.skipped.extend(parsed.skipped)
        if self.done:
            self.truncated = parsed.truncated
        return parsed.records


def stream_session(
    run_dir: str | os.PathLike[str],
    sink: Sink,
    forget: Callable[[str], None],
    chunk_bytes: int = CHUNK_BYTES,
) -> Session:
    """Read a run directory into ``sink``; returns its session (headers, no records).

    Args:
        sink: takes each chunk's records of a file, in file order.
        forget: called with a file that turned out corrupt after some of it was sunk.
        chunk_bytes: the most read of one file at a time (with many files, less: all
            of them together read :data:`ROUND_BYTES` a round).

    Raises:
        NoDataError: no directory, or no trace file in it.
        TraceFormatError: no readable trace file.
    """
    files = discover_trace_files(run_dir)
    if not files:
        raise NoDataError(f"{run_dir}: no dl2 trace files (*{TRACE_SUFFIX}) in this directory")
    readers: list[_Reader] = []
    errors: dict[str, str] = {}  # file -> why it is skipped
    for file in files:
        try:
            readers.append(_Reader(file))
        except TraceFormatError as err:
            errors[str(file)] = str(err)
    # per rank, its files in the order a session prefers them (newest first, later on a tie)
    choices: dict[int, list[_Reader]] = {}
    for reader in readers:
        choices.setdefault(reader.header.rank, []).insert(0, reader)
    for options in choices.values():
        options.sort(key=lambda r: r.header.wall, reverse=True)
    reading = [options.pop(0) for options in choices.values()]
    while reading:
        size = min(chunk_bytes, max(MIN_CHUNK_BYTES, ROUND_BYTES // len(reading)))
        for reader in list(reading):
            try:
                records = reader.read(size)
            except TraceFormatError as err:
                errors[reader.name] = str(err)
                forget(reader.name)
                readers.remove(reader)
                reading.remove(reader)
                options = choices[reader.header.rank]
                if options:
                    reading.append(options.pop(0))
                continue
            sink(reader.name, reader.header, records, reader.truncated)
            if reader.done:
                reading.remove(reader)
    skipped = [errors[str(f)] for f in files if str(f) in errors]  # in file order
    meta = read_run_meta(run_dir)
    if not readers:
        raise TraceFormatError(skipped[0])
    return build_session(
        [RankTrace(r.name, r.header, (), r.truncated, tuple(r.skipped)) for r in readers],
        run_states(meta),
        run_dir=str(run_dir),
        warnings=[f"skipped {e}" for e in skipped],
        ending=run_ending(meta),
    )
