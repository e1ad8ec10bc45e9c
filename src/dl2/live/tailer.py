"""Incremental reading of a run directory's trace files while the job writes them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from dl2.errors import TraceFormatError
from dl2.trace.format import TRACE_SUFFIX
from dl2.trace.format import RankTrace
from dl2.trace.format import parse_header
from dl2.trace.format import parse_records

# Watchdog reports are not progress: a rank that only writes them is quiet.
_NOT_PROGRESS = frozenset({"state"})


@dataclass
class _File:
    path: Path
    offset: int = 0
    header: dict[str, Any] | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    progress: int = 0
    truncated: str | None = None
    error: str | None = None


class TraceTailer:
    """Reads new complete records from every trace file of a directory on each refresh.

    A partial last line is left for the next refresh (the rank is mid-write); a file
    that turns out corrupt is reported once and then ignored.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self._files: dict[str, _File] = {}
        self.errors: list[str] = []

    def refresh(self) -> bool:
        """Read what was appended since the last call; True if any record was new."""
        grew = False
        try:
            names = sorted(p.name for p in self.run_dir.iterdir() if p.name.endswith(TRACE_SUFFIX))
        except OSError:
            return False
        for name in names:
            entry = self._files.setdefault(name, _File(self.run_dir / name))
            if entry.error is None and self._read(entry):
                grew = True
        return grew

    def _read(self, entry: _File) -> bool:
        try:
            with open(entry.path, "rb") as handle:
                handle.seek(entry.offset)
                data = handle.read()
        except OSError:
            return False
        if not data:
            return False
        try:
            if entry.header is None:
                newline = data.find(b"\n")
                if newline < 0:
                    return False
                entry.header = parse_header(data[:newline], str(entry.path))
                entry.offset += newline + 1
                data = data[newline + 1 :]
            records, truncated, consumed = parse_records(data, str(entry.path))
        except TraceFormatError as err:
            entry.error = str(err)
            self.errors.append(str(err))
            return False
        entry.offset += consumed
        entry.truncated = truncated
        entry.records.extend(records)
        entry.progress += sum(1 for r in records if r.get("k") not in _NOT_PROGRESS)
        return bool(records)

    def traces(self) -> list[RankTrace]:
        """A snapshot of every readable file as a RankTrace (records read so far)."""
        return [
            RankTrace(str(e.path), e.header, tuple(e.records), e.truncated)
            for e in self._files.values()
            if e.header is not None
        ]

    def progress(self) -> dict[int, int]:
        """rank -> number of progress records read so far."""
        return {int(e.header["rank"]): e.progress for e in self._files.values() if e.header}

    def pids(self) -> dict[int, int]:
        """rank -> pid of the process that writes its trace."""
        return {
            int(e.header["rank"]): int(e.header.get("pid", 0))
            for e in self._files.values()
            if e.header
        }

    def hosts(self) -> dict[int, str]:
        return {
            int(e.header["rank"]): str(e.header.get("host", ""))
            for e in self._files.values()
            if e.header
        }
