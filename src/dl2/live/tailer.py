"""Incremental reading of trace files while the job writes them.

A :class:`TraceTailer` follows every trace file of a run directory (``refresh``) and,
for multi-node runs, the files other nodes' monitors mirror through the job's store
(``ingest``).  Both go through the same reader, so a mirrored file reads exactly like a
local one.  Each read's new records go straight into the incremental model
(:class:`dl2.model.incremental.Model`, ``tailer.model``), which the monitor's snapshots
read: the tailer keeps no records, only what it needs per file (its last record, its
open calls, its progress count).  The segments of one process are one trace, fed to the
model as one stream, in order: a segment is read to its end before the next, which
exists only once it is final; a segment the recorder deleted (rotated away) before it
was read through leaves a gap, and the model restarts that rank at the next segment's
checkpoint.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import msgspec

from dl2.errors import TraceFormatError
from dl2.model.incremental import DEFAULT_WINDOW
from dl2.model.incremental import Model
from dl2.model.stuck import stall_kind
from dl2.trace.format import TRACE_SUFFIX
from dl2.trace.format import RankTrace
from dl2.trace.format import TraceReader
from dl2.trace.format import stream_of
from dl2.trace.schema.decode import CheckpointRecord
from dl2.trace.schema.decode import EndRecord
from dl2.trace.schema.decode import Header
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import Record
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import StateRecord
from dl2.trace.schema.decode import StoreRecord
from dl2.trace.schema.decode import WaitRecord
from dl2.trace.session import preference


@dataclass
class _File:
    """One trace file (one segment) as read so far.

    Attributes:
        name: the file name (unique per rank process and segment).
        path: where to read it; None for a file mirrored from another node.
        reader: its incremental reader (``reader.consumed``: the bytes read).
        outbox: consumed bytes not yet handed to :meth:`TraceTailer.drain`.
        last: the last record read.
        records_seen: every record read, watchdog reports included.
        open_calls: op, wait and blocking store call ids entered and not yet returned.
        stall: the last record is a watchdog ``state`` that finds the rank in
            communication (backward, comm) with pending works.
        partial_since: when a partial last line was first seen at the read offset.
    """

    name: str
    path: Path | None
    reader: TraceReader = field(init=False)
    last: Record | None = None
    progress: int = 0
    records_seen: int = 0
    error: str | None = None
    outbox: list[bytes] = field(default_factory=list)
    open_calls: set[int] = field(default_factory=set)
    stall: bool = False
    partial_since: float | None = None
    lineno: int = 2  # of the first record line not consumed yet
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reader = TraceReader(str(self.path or self.name))
        self.stem, self.segment = stream_of(self.name)

    @property
    def header(self) -> Header | None:
        return self.reader.header

    @property
    def offset(self) -> int:
        return self.reader.consumed

    @property
    def truncated(self) -> str | None:
        return self.reader.truncated

    def feed(self, data: bytes, now: float, keep: bool) -> list[Record]:
        """Parse ``data`` (what follows ``offset``); returns the new records."""
        before = self.reader.consumed
        try:
            records = self.reader.feed(data)
        except TraceFormatError as err:
            self.error = str(err)
            raise
        used = self.reader.consumed - before
        if keep and used:
            self.outbox.append(data[:used])
        if self.reader.truncated is None:
            self.partial_since = None
        elif self.partial_since is None or used:
            self.partial_since = now
        for record in records:
            self._note(record)
        if records:
            self.last = records[-1]
        self.records_seen += len(records)
        return records

    def _note(self, record: Record) -> None:
        if isinstance(record, StateRecord):
            # Watchdog reports are not progress: a rank that only writes them is quiet.
            self.stall = stall_kind(record.where, record.pending) is not None
            return
        if isinstance(record, CheckpointRecord):
            # The state the previous segment left (written along with a record there).
            issued = set(record.issued)
            self.open_calls = {op.id for op in record.open if op.id not in issued}
            self.open_calls.update(wait.id for wait in record.waits)
            self.open_calls.update(call.id for call in record.stores)
            return
        self.progress += 1
        if isinstance(record, OpRecord | WaitRecord):
            self.stall = False
            self.open_calls.add(record.id)
        elif isinstance(record, RetRecord):
            self.stall = False
            self.open_calls.discard(record.id)
        elif isinstance(record, StoreRecord):
            self.stall = False
            if record.block:  # store.get / wait: in communication until its ret
                self.open_calls.add(record.id)
        elif isinstance(record, EndRecord):
            self.open_calls.clear()
            self.stall = False

    @property
    def rank(self) -> int:
        assert self.header is not None
        return self.header.rank


class TraceTailer:
    """Reads new complete records of trace files on each refresh.

    A partial last line is left for the next refresh (the rank is mid-write); a file
    that turns out corrupt is reported once and then ignored.

    Args:
        run_dir: the directory whose ``*.dl2.jsonl`` files are followed.
        keep_outbox: keep the bytes read for :meth:`drain` (to mirror them elsewhere).
        window: the model's window (see :class:`dl2.model.incremental.Model`).

    Attributes:
        model: every record read, fed file by file as it is read.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        keep_outbox: bool = False,
        window: int | None = DEFAULT_WINDOW,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.keep_outbox = keep_outbox
        self._files: dict[str, _File] = {}
        self.errors: list[str] = []
        self.model = Model(window=window)
        self._newest_files: dict[int, _File] | None = None  # until files change
        # stem -> (progress, records seen) of its segments dropped after rotation
        self._retired: dict[str, tuple[int, int]] = {}

    def _feed(self, entry: _File, data: bytes, now: float, keep: bool) -> bool:
        """Parse new bytes of a file into the model; True if a record was new."""
        if entry.header is None:
            self._newest_files = None  # a rank's file may come in
        try:
            records = entry.feed(data, now, keep)
        except TraceFormatError as err:
            self.errors.append(str(err))  # the file is not read further
            return False
        if entry.header is not None:
            # a process's segments are one stream to the model
            self.model.feed(entry.stem, entry.header, records, entry.truncated)
        return bool(records)

    # -- reading -----------------------------------------------------------------------

    def refresh(self, now: float | None = None) -> bool:
        """Read what was appended since the last call; True if any record was new."""
        now = time.monotonic() if now is None else now
        grew = False
        try:
            names = sorted(p.name for p in self.run_dir.iterdir() if p.name.endswith(TRACE_SUFFIX))
        except OSError:
            return False
        for name in names:
            entry = self._files.get(name)
            if entry is None:
                entry = self._files[name] = _File(name, self.run_dir / name)
            if entry.error is None and entry.path is not None and self._read(entry, now):
                grew = True
        self._retire(set(names))
        return grew

    def _retire(self, present: set[str]) -> None:
        """Drop local segments the recorder deleted, once a later one of theirs exists."""
        latest: dict[str, int] = {}
        for entry in self._files.values():
            latest[entry.stem] = max(latest.get(entry.stem, 0), entry.segment)
        for name, entry in list(self._files.items()):
            if entry.path is None or name in present or entry.segment >= latest[entry.stem]:
                continue
            progress, seen = self._retired.get(entry.stem, (0, 0))
            self._retired[entry.stem] = (progress + entry.progress, seen + entry.records_seen)
            del self._files[name]
            self._newest_files = None

    def _read(self, entry: _File, now: float) -> bool:
        assert entry.path is not None
        try:
            with open(entry.path, "rb") as handle:
                handle.seek(entry.offset)
                data = handle.read()
        except OSError:
            return False
        if not data:
            return False
        return self._feed(entry, data, now, self.keep_outbox)

    def ingest(self, name: str, data: bytes, now: float | None = None) -> bool:
        """Add bytes of a file mirrored from elsewhere (complete lines, in order)."""
        now = time.monotonic() if now is None else now
        entry = self._files.setdefault(name, _File(name, None))
        if entry.error is not None or not data:
            return False
        return self._feed(entry, data, now, keep=False)

    def forget(self, names: set[str]) -> None:
        """Drop files (mirrored ones whose source went away)."""
        for name in names:
            entry = self._files.pop(name, None)
            if entry is not None and not any(e.stem == entry.stem for e in self._files.values()):
                self.model.forget(entry.stem)
        self._newest_files = None

    def drain(self) -> dict[str, bytes]:
        """file name -> bytes read since the last drain (complete lines, header included)."""
        out: dict[str, bytes] = {}
        for name, entry in self._files.items():
            if entry.outbox:
                out[name] = b"".join(entry.outbox)
                entry.outbox.clear()
        return out

    # -- what was read -----------------------------------------------------------------

    def _ranked(self) -> list[_File]:
        return [e for e in self._files.values() if e.header is not None]

    def local_names(self) -> set[str]:
        return {e.name for e in self._files.values() if e.path is not None}

    def _streams(self) -> dict[str, list[_File]]:
        """stem -> the readable segments of that process."""
        streams: dict[str, list[_File]] = {}
        for entry in self._ranked():
            streams.setdefault(entry.stem, []).append(entry)
        return streams

    def traces(self) -> list[RankTrace]:
        """Every process's trace as a RankTrace of its first segment's header, its
        truncation and corrupt-line notes; its records are in :attr:`model`, not here."""
        traces = []
        resumed = self.model.resumed()
        for files in self._streams().values():
            files.sort(key=lambda e: e.segment)
            first, last = files[0], files[-1]
            header = first.header
            assert header is not None
            if header.segment > 0 and header.rank not in resumed:
                # its earlier segments were read before the recorder deleted them: the
                # model has the whole history, the trace is not "rotated" to the analysis
                header = msgspec.structs.replace(header, segment=0)
            traces.append(
                RankTrace(
                    str(first.path or first.name),
                    header,
                    (),
                    last.truncated,
                    tuple(line for e in files for line in e.reader.skipped),
                    tuple(w for e in files for w in e.reader.warnings),
                    tuple(str(e.path or e.name) for e in files),
                )
            )
        return traces

    def progress(self) -> dict[int, int]:
        """rank -> number of progress records read so far (the newest process of a rank,
        all its segments, those dropped included)."""
        streams = self._streams()
        return {
            rank: self._retired.get(e.stem, (0, 0))[0] + sum(f.progress for f in streams[e.stem])
            for rank, e in self._newest().items()
        }

    def records_seen(self) -> int:
        """Every record read so far, all files: changes whenever anything was read."""
        retired = sum(seen for _, seen in self._retired.values())
        return retired + sum(e.records_seen for e in self._files.values())

    def possibly_blocked(self) -> set[int]:
        """Ranks that are inside a communication call, or stalled with pending works."""
        return {r for r, e in self._newest().items() if e.open_calls or e.stall}

    def ended(self) -> set[int]:
        """Ranks whose last record is an ``end`` record."""
        return {r for r, e in self._newest().items() if isinstance(e.last, EndRecord)}

    def raised(self) -> set[int]:
        """Ranks whose program ended with an uncaught exception (their ``end`` says so)."""
        return {
            r
            for r, e in self._newest().items()
            if isinstance(e.last, EndRecord) and e.last.err is not None
        }

    def partial(self) -> set[int]:
        """Ranks whose file ends in a partial line (a record being written)."""
        return {r for r, e in self._newest().items() if e.partial_since is not None}

    def stuck_partial(self, now: float, after: float) -> dict[int, float]:
        """rank -> seconds its file has ended in a partial line, for those over ``after``."""
        return {
            r: now - e.partial_since
            for r, e in self._newest().items()
            if e.partial_since is not None and now - e.partial_since >= after
        }

    def offsets(self) -> dict[str, int]:
        """File name -> the bytes of it read so far, for every file: this node's, and
        those mirrored from the others (kept in the run directory's
        :data:`~dl2.trace.session.MIRRORED_DIR` as they came)."""
        return {e.name: e.offset for e in self._files.values()}

    def pids(self) -> dict[int, int]:
        """rank -> pid of the process that writes its trace (local files only)."""
        return {
            r: e.header.pid
            for r, e in self._newest().items()
            if e.path is not None and e.header is not None
        }

    def rank_of(self, name: str) -> int | None:
        entry = self._files.get(name)
        return entry.rank if entry is not None and entry.header is not None else None

    def local_ranks(self) -> set[int]:
        return {e.rank for e in self._ranked() if e.path is not None}

    def hosts(self) -> dict[int, str]:
        return {r: e.header.host for r, e in self._newest().items() if e.header is not None}

    def _newest(self) -> dict[int, _File]:
        """rank -> the last segment of its newest process (a restarted rank writes a new
        trace; every segment's header has its process's start)."""
        if self._newest_files is None:
            self._newest_files = self._find_newest()
        return self._newest_files

    def _find_newest(self) -> dict[int, _File]:
        best: dict[int, _File] = {}
        ranked = list(self._ranked())
        traced = {(e.header.host, e.header.pid) for e in ranked if e.header is not None}
        for entry in ranked:
            rank = entry.rank
            other = best.get(rank)
            assert entry.header is not None
            key = (*preference(entry.header, traced), entry.segment)
            if (
                other is None
                or other.header is None
                or key >= (*preference(other.header, traced), other.segment)
            ):
                best[rank] = entry
        return best
