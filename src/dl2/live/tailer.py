"""Incremental reading of trace files while the job writes them.

A :class:`TraceTailer` follows every trace file of a run directory (``refresh``) and,
for multi-node runs, the files other nodes' monitors mirror through the job's store
(``ingest``).  Both go through the same parser, so a mirrored file reads exactly like a
local one.  Each read's new records go straight into the incremental model
(:class:`dl2.model.incremental.Model`, ``tailer.model``), which the monitor's snapshots
read: the tailer keeps no records, only what it needs per file (its last record, its
open calls, its progress count).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from dl2.errors import TraceFormatError
from dl2.model.incremental import DEFAULT_WINDOW
from dl2.model.incremental import Model
from dl2.model.stuck import stall_kind
from dl2.trace.format import TRACE_SUFFIX
from dl2.trace.format import RankTrace
from dl2.trace.format import parse_header
from dl2.trace.format import parse_records
from dl2.trace.schema.decode import EndRecord
from dl2.trace.schema.decode import Header
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import Record
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import StateRecord
from dl2.trace.schema.decode import StoreRecord
from dl2.trace.schema.decode import WaitRecord


@dataclass
class _File:
    """One trace file as read so far.

    Attributes:
        name: the file name (unique per rank process).
        path: where to read it; None for a file mirrored from another node.
        offset: bytes consumed (complete lines only).
        outbox: consumed bytes not yet handed to :meth:`TraceTailer.drain`.
        last: the last record read.
        records_seen: every record read, watchdog reports included.
        open_calls: op, wait and blocking store call ids entered and not yet returned.
        stall: the last record is a watchdog ``state`` that finds the rank in
            communication (backward, comm) with pending works.
        partial_since: when a partial last line was first seen at ``offset``.
    """

    name: str
    path: Path | None
    offset: int = 0
    header: Header | None = None
    last: Record | None = None
    progress: int = 0
    records_seen: int = 0
    truncated: str | None = None
    error: str | None = None
    outbox: list[bytes] = field(default_factory=list)
    open_calls: set[int] = field(default_factory=set)
    stall: bool = False
    partial_since: float | None = None
    lineno: int = 2  # of the first record line not consumed yet
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def feed(self, data: bytes, now: float, keep: bool) -> list[Record]:
        """Parse ``data`` (what follows ``offset``); returns the new records."""
        start = 0
        try:
            if self.header is None:
                newline = data.find(b"\n")
                if newline < 0:
                    return []
                self.header = parse_header(data[:newline], self.name)
                start = newline + 1
            parsed = parse_records(data[start:], self.name, self.lineno)
        except TraceFormatError as err:
            self.error = str(err)
            raise
        records, truncated, consumed = parsed.records, parsed.truncated, parsed.consumed
        self.lineno += parsed.lines
        self.skipped.extend(parsed.skipped)
        used = start + consumed
        if keep and used:
            self.outbox.append(data[:used])
        self.offset += used
        if truncated is None:
            self.partial_since = None
        elif self.partial_since is None or consumed:
            self.partial_since = now
        self.truncated = truncated
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
            self.model.feed(entry.name, entry.header, records, entry.truncated)
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
            entry = self._files.setdefault(name, _File(name, self.run_dir / name))
            if entry.error is None and entry.path is not None and self._read(entry, now):
                grew = True
        return grew

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
            self._files.pop(name, None)
            self.model.forget(name)
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

    def traces(self) -> list[RankTrace]:
        """Every readable file as a RankTrace of its header and truncation note; its
        records are in :attr:`model`, not here."""
        return [
            RankTrace(str(e.path or e.name), e.header, (), e.truncated, tuple(e.skipped))
            for e in self._ranked()
            if e.header is not None
        ]

    def progress(self) -> dict[int, int]:
        """rank -> number of progress records read so far (the newest file of a rank)."""
        return {e.rank: e.progress for e in self._newest().values()}

    def records_seen(self) -> int:
        """Every record read so far, all files: changes whenever anything was read."""
        return sum(e.records_seen for e in self._files.values())

    def possibly_blocked(self) -> set[int]:
        """Ranks that are inside a communication call, or stalled with pending works."""
        return {r for r, e in self._newest().items() if e.open_calls or e.stall}

    def ended(self) -> set[int]:
        """Ranks whose last record is an ``end`` record."""
        return {r for r, e in self._newest().items() if isinstance(e.last, EndRecord)}

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
        """rank -> its newest file (a restarted rank writes a new one)."""
        if self._newest_files is None:
            self._newest_files = self._find_newest()
        return self._newest_files

    def _find_newest(self) -> dict[int, _File]:
        best: dict[int, _File] = {}
        for entry in self._ranked():
            rank = entry.rank
            other = best.get(rank)
            wall = entry.header.wall if entry.header is not None else 0
            if other is None or other.header is None or wall >= other.header.wall:
                best[rank] = entry
        return best
