"""Reading a run directory chunk by chunk, for a reader that keeps no records itself.

:func:`stream_session` reads the trace files of a run directory round-robin, one chunk
of each in turn, and hands each chunk's complete records to a ``sink`` (the incremental
model): no more than a chunk per file is held at once, and the ranks advance together,
so that the sink can fold what all of them finished.  It returns the session as
:func:`dl2.trace.session.load_session` would, with the traces' headers and truncation
notes but no records (the sink has them).

A process's segment files are one trace, read in order and handed to the sink under
the process's stream name (:func:`dl2.trace.format.stream_of`).  What
:func:`~dl2.trace.session.load_session` does, this does too: a file that is not a
readable trace (empty, foreign, another version, corrupt before its last line) is
skipped with a warning, and when a rank has several files the newest is its own (a
skipped newest one gives way to the next).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dl2.errors import TraceFormatError
from dl2.trace.format import RankTrace
from dl2.trace.format import TraceReader
from dl2.trace.format import stream_of
from dl2.trace.schema.decode import Header
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import Record
from dl2.trace.schema.reader import CallRun
from dl2.trace.session import Session
from dl2.trace.session import build_session
from dl2.trace.session import group_streams
from dl2.trace.session import meta_warnings
from dl2.trace.session import of_other_runs
from dl2.trace.session import preference
from dl2.trace.session import run_ending
from dl2.trace.session import run_files
from dl2.trace.session import run_states

#: bytes read of one file at a time, at most
CHUNK_BYTES = 1 << 16
#: bytes read of all files in one round: many files are read in smaller chunks, so that
#: the ranks still advance together (and the sink can fold what they all finished)
ROUND_BYTES = 1 << 20
#: bytes read of one file at a time, at least (unless ``chunk_bytes`` is smaller)
MIN_CHUNK_BYTES = 1 << 10

#: takes (file, its header, new records, truncation note once the file is read through)
Sink = Callable[[str, Header, Sequence[Record], str | None], None]
#: takes (file, its header, the ops of plain blocking calls, their waits' ids or None:
#: each op's id + 1)
CallsSink = Callable[[str, Header, Sequence[OpRecord], Sequence[int] | None], None]


class _Reader:
    """One process's trace (its segment files, in order), read a chunk at a time."""

    def __init__(
        self, paths: list[Path], calls: bool = False, limits: Mapping[str, int] | None = None
    ) -> None:
        self.calls = calls
        self.limits = limits or {}  # file name -> the bytes of it to read, at most
        self.paths = [str(p) for p in paths]
        self.name = self.paths[0]
        self.stem = stream_of(Path(self.name).name)[0]
        self._index = 0
        self._least = 0  # bytes to read at least (a line longer than a chunk)
        self.readers: list[TraceReader] = []
        self.errors: list[str] = []
        self.done = False
        self.pending: list[Record] = []  # records read with the header
        # bytes of the current segment read ahead (with its header): a small trace is
        # then opened once, not once per chunk (``_buffer_at``: the offset of its first
        # byte; ``_buffer_end``: it reaches the end of the segment as read then)
        self._buffer = b""
        self._buffer_at = 0
        self._buffer_end = False
        self._open()
        # the first readable segment's header (the trace starts there)
        first = self.readers[0]
        # only the header line now: records are read round by round, so that no more
        # than a chunk per file is held at once (8,192 small traces read whole here
        # would all be in memory before the model took any)
        size = 4096
        while True:
            data = self._chunk(size)
            newline = data.find(b"\n")
            if newline >= 0:
                first.feed(data[: newline + 1])
                break
            if not data or self._ended:
                raise TraceFormatError(
                    f"{self.name}: empty trace file"
                    if not data
                    else f"{self.name}: truncated header (the rank died while opening its trace)"
                )
            size *= 2  # a header longer than the chunk is read again, whole
        assert first.header is not None
        self.header: Header = first.header
        self._buffer, self._buffer_at, self._buffer_end = data, 0, self._ended

    def _open(self) -> None:
        self.readers.append(TraceReader(self.paths[self._index], self.calls))
        self._ended = False
        self._buffer = b""

    def _chunk(self, size: int) -> bytes:
        """The next ``size`` bytes of the current segment after what its reader
        consumed (a partial last line is read again, whole, with the next chunk)."""
        path = self.paths[self._index]
        reader = self.readers[-1]
        buffer = self._buffer
        if buffer:
            start = reader.consumed - self._buffer_at
            end = start + size
            if start >= 0 and (end <= len(buffer) or self._buffer_end):
                data = buffer[start:end]
                self._ended = self._buffer_end and end >= len(buffer)
                if end >= len(buffer):
                    self._buffer = b""
                return data
            self._buffer = b""
        limit = self.limits.get(os.path.basename(path))
        if limit is not None:
            size = max(0, min(size, limit - reader.consumed))
        try:
            # os-level calls: a file object (buffer, text layer) cost more than the read
            # of a small trace (8,192 of them, opened once each)
            fd = os.open(path, os.O_RDONLY)
            try:
                data = os.pread(fd, size, reader.consumed)
            finally:
                os.close(fd)
        except OSError as err:
            raise TraceFormatError(f"{path}: cannot read trace file: {err.strerror}") from None
        # the segment is read through after this chunk
        self._ended = len(data) < size or (limit is not None and reader.consumed + size >= limit)
        return data

    @property
    def truncated(self) -> str | None:
        return self.readers[-1].truncated

    @property
    def skipped(self) -> list[tuple[int, str]]:
        return [line for reader in self.readers for line in reader.skipped]

    @property
    def warnings(self) -> list[str]:
        return self.errors + [w for reader in self.readers for w in reader.warnings]

    def read(self, size: int) -> list[Record]:
        """The complete records of the next chunk (the note on a partial last line is
        set once the trace is read through; corrupt lines before it are skipped).

        Raises:
            TraceFormatError: the first segment cannot be read.
        """
        records, self.pending = self.pending, []
        reader = self.readers[-1]
        try:
            data = self._chunk(max(size, self._least))
            if data:
                before = reader.consumed
                records += reader.feed(data)
                if reader.consumed > before:
                    self._least = 0
                    if not self._ended or reader.consumed - before < len(data):
                        return records
                    # the segment's end, all of it consumed: on at once (opening the
                    # file again only to find its end cost as much as reading it)
                if not self._ended:  # one line longer than the chunk: read more at once
                    self._least = 2 * len(data)
                    return records
                # nothing more to consume: a partial or corrupt last line stays so
        except TraceFormatError as err:
            if len(self.readers) == 1:
                raise
            # a later segment gone or unreadable: the next one's checkpoint resumes
            self.errors.append(f"skipped {err}")
            data = b""
        # this segment is read through: on to the next one of the process, if any
        if reader.truncated and self._index + 1 < len(self.paths):
            self.errors.append(f"{reader.path}: {reader.truncated}")
        self._index += 1
        if self._index >= len(self.paths):
            self.done = True
            return records
        self._open()
        return records


def _split(
    items: list[Any], key: str, header: Header, truncated: str | None, sink: Sink, calls: CallsSink
) -> None:
    """Hand a chunk read in call mode to the two sinks, in order: runs of blocking
    calls (each a :class:`~dl2.trace.schema.reader.CallRun`) to ``calls``, the records
    between to ``sink``."""
    start = 0
    for index, item in enumerate(items):
        if type(item) is CallRun:
            if index > start:
                sink(key, header, items[start:index], None)
            calls(key, header, item, None)
            start = index + 1
    if start < len(items):
        sink(key, header, items[start:], None)
    sink(key, header, [], truncated)


def stream_session(
    run_dir: str | os.PathLike[str],
    sink: Sink,
    forget: Callable[[str], None],
    chunk_bytes: int = CHUNK_BYTES,
    calls_sink: CallsSink | None = None,
) -> Session:
    """Read a run directory into ``sink``; returns its session (headers, no records).

    Args:
        sink: takes each chunk's records of a file, in file order.
        forget: called with a file that turned out corrupt after some of it was sunk.
        chunk_bytes: the most read of one file at a time (with many files, less: all
            of them together read :data:`ROUND_BYTES` a round).
        calls_sink: if given, takes the plain blocking calls (op, ret, wait, ret) of
            a chunk as (file, header, ops, wait ids), in turn with ``sink`` taking the
            other records, in file order (see :meth:`Model.feed_calls
            <dl2.model.incremental.Model.feed_calls>`).

    Raises:
        NoDataError: no directory, or no trace file in it.
        TraceFormatError: no readable trace file.
    """
    meta, limits, files = run_files(run_dir)
    readers: list[_Reader] = []
    errors: dict[str, str] = {}  # file -> why it is skipped
    for stream in group_streams(files):
        try:
            readers.append(_Reader(stream, calls_sink is not None, limits))
        except TraceFormatError as err:
            errors[str(stream[0])] = str(err)
    others = of_other_runs([reader.header for reader in readers], meta)
    for reader, why in zip(readers, others, strict=True):
        if why is not None:
            errors[reader.name] = f"{reader.name}: {why}"
    readers = [r for r, why in zip(readers, others, strict=True) if why is None]
    # per rank, its files in the order a session prefers them (newest first, later on a tie)
    choices: dict[int, list[_Reader]] = {}
    for reader in readers:
        choices.setdefault(reader.header.rank, []).insert(0, reader)
    traced = {(reader.header.host, reader.header.pid) for reader in readers}
    for options in choices.values():
        options.sort(key=lambda r: preference(r.header, traced), reverse=True)
    reading = [options.pop(0) for options in choices.values()]
    while reading:
        size = min(chunk_bytes, max(MIN_CHUNK_BYTES, ROUND_BYTES // len(reading)))
        for reader in list(reading):
            try:
                records = reader.read(size)
            except TraceFormatError as err:
                errors[reader.name] = str(err)
                forget(reader.stem)
                readers.remove(reader)
                reading.remove(reader)
                options = choices[reader.header.rank]
                if options:
                    reading.append(options.pop(0))
                continue
            if calls_sink is None:
                sink(reader.stem, reader.header, records, reader.truncated)
            else:
                _split(records, reader.stem, reader.header, reader.truncated, sink, calls_sink)
            if reader.done:
                reading.remove(reader)
    skipped = [errors[str(f)] for f in files if str(f) in errors]  # in file order
    if not readers:
        raise TraceFormatError(skipped[0])
    return build_session(
        [
            RankTrace(
                r.name,
                r.header,
                (),
                r.truncated,
                tuple(r.skipped),
                tuple(r.warnings),
                tuple(r.paths),
            )
            for r in readers
        ],
        run_states(meta),
        run_dir=str(run_dir),
        warnings=[*meta_warnings(meta), *(f"skipped {e}" for e in skipped)],
        ending=run_ending(meta),
    )
