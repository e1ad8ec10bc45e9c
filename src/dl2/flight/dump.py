"""A Flight Recorder dump's schema, checked into typed entries.

The fields, as PyTorch writes them (``FlightRecorderDetail.hpp``, schema versions 2.4
to 2.10): top level ``version``, ``pg_config`` ({name: {name, desc, ranks}}, ``ranks``
a string such as ``"[0, 1]"`` of global ranks), ``pg_status``, ``entries`` (oldest
first; absent from a JSON dump with none) and ``comm_lib_version`` / ``nccl_version``.
An entry: ``record_id``, ``pg_id``, ``process_group`` ((name, desc): a tuple in a
pickle, a list in JSON), ``collective_seq_id``, ``p2p_seq_id``, ``op_id``,
``profiling_name`` (``nccl:all_reduce``, ``nccl:send 0->1``), ``input_sizes`` /
``output_sizes``, ``input_dtypes`` / ``output_dtypes``, ``state`` (scheduled | started
| completed), ``time_created_ns``, ``time_discovered_started_ns`` /
``_completed_ns`` (None, or 0 in JSON, when unseen), ``retired``, ``timeout_ms``,
``is_p2p`` and, in a pickle dumped with stack traces only, ``frames`` ([{name,
filename, line}], innermost first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dl2.flight.safe import FlightDumpError

#: schema versions this reader was checked against
KNOWN_VERSIONS = ("2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10")


@dataclass(frozen=True)
class FrFrame:
    """One Python frame of an entry's stack."""

    name: str
    filename: str
    line: int


@dataclass(frozen=True)
class FrEntry:
    """One launch recorded by FR."""

    record_id: int
    pg_id: int
    pg_name: str
    pg_desc: str
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    state: str
    retired: bool
    is_p2p: bool
    time_created_ns: int
    started: bool
    completed: bool
    frames: tuple[FrFrame, ...] | None  # None: the dump has no stacks

    @property
    def backend(self) -> str:
        """The communication library of the profiling name ("nccl", "gloo", ...)."""
        return self.profiling_name.partition(":")[0] if ":" in self.profiling_name else ""

    @property
    def name(self) -> str:
        """The profiling name without its backend prefix (``send 0->1``, ``all_reduce``)."""
        return self.profiling_name.partition(":")[2] or self.profiling_name


@dataclass(frozen=True)
class FrDump:
    """One rank's dump."""

    version: str
    comm_lib_version: str
    groups: dict[str, tuple[int, ...]]  # pg name -> global ranks (valid pg_config only)
    group_descs: dict[str, str]
    entries: tuple[FrEntry, ...]
    has_frames: bool


_RANKS = re.compile(r"^\[ *([0-9]+( *, *[0-9]+)*)? *,? *\]$")


def parse_ranks(text: Any) -> tuple[int, ...] | None:
    """The global ranks of a ``pg_config`` ``ranks`` string ("[0, 1]"), None if broken."""
    if isinstance(text, list | tuple) and all(type(r) is int for r in text):
        return tuple(text)
    if not isinstance(text, str) or not _RANKS.match(text.strip()):
        return None
    inner = text.strip()[1:-1].strip().rstrip(",")
    return tuple(int(part) for part in inner.split(",")) if inner else ()


def _int(value: Any, field: str, where: str, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if type(value) is int:
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value):
        return int(value)
    raise FlightDumpError(f"{where}: {field} is {type(value).__name__}, not an integer")


def _str(value: Any, field: str, where: str) -> str:
    if not isinstance(value, str):
        raise FlightDumpError(f"{where}: {field} is {type(value).__name__}, not a string")
    return value


def _sizes(value: Any, field: str, where: str) -> tuple[tuple[int, ...], ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(
        isinstance(s, list | tuple) and all(type(d) is int for d in s) for s in value
    ):
        raise FlightDumpError(f"{where}: {field} is not a list of shapes")
    return tuple(tuple(s) for s in value)


def _strs(value: Any, field: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(s, str) for s in value):
        raise FlightDumpError(f"{where}: {field} is not a list of strings")
    return tuple(value)


def _frames(value: Any, where: str) -> tuple[FrFrame, ...]:
    if not isinstance(value, list | tuple):
        raise FlightDumpError(f"{where}: frames is not a list")
    frames = []
    for frame in value:
        if not isinstance(frame, dict):
            raise FlightDumpError(f"{where}: a frame is not a dict")
        frames.append(
            FrFrame(
                name=str(frame.get("name", "?")),
                filename=_str(frame.get("filename", "?"), "frame filename", where),
                line=_int(frame.get("line", 0), "frame line", where, 0),
            )
        )
    return tuple(frames)


def _seen(value: Any) -> bool:
    """A ``time_discovered_*_ns``: None (pickle) or 0 (JSON) when not seen."""
    return value is not None and value != 0 and value != "0"


def parse_entry(raw: Any, where: str) -> FrEntry:
    """One entry, checked.

    Raises:
        FlightDumpError: a required field missing or of the wrong type.
    """
    if not isinstance(raw, dict):
        raise FlightDumpError(f"{where}: not a dict")
    pg = raw.get("process_group")
    if not isinstance(pg, list | tuple) or len(pg) < 1 or not isinstance(pg[0], str):
        raise FlightDumpError(f"{where}: process_group is not a (name, desc) pair")
    name = _str(raw.get("profiling_name"), "profiling_name", where)
    state = raw.get("state", "scheduled")
    state = state if state in ("scheduled", "started", "completed") else "scheduled"
    completed = state == "completed" or _seen(raw.get("time_discovered_completed_ns"))
    started = completed or state == "started" or _seen(raw.get("time_discovered_started_ns"))
    frames = raw.get("frames")
    return FrEntry(
        record_id=_int(raw.get("record_id"), "record_id", where),
        pg_id=_int(raw.get("pg_id"), "pg_id", where, 0),
        pg_name=pg[0],
        pg_desc=str(pg[1]) if len(pg) > 1 else "",
        collective_seq_id=_int(raw.get("collective_seq_id"), "collective_seq_id", where, 0),
        p2p_seq_id=_int(raw.get("p2p_seq_id"), "p2p_seq_id", where, 0),
        op_id=_int(raw.get("op_id"), "op_id", where, 0),
        profiling_name=name,
        input_sizes=_sizes(raw.get("input_sizes"), "input_sizes", where),
        output_sizes=_sizes(raw.get("output_sizes"), "output_sizes", where),
        input_dtypes=_strs(raw.get("input_dtypes"), "input_dtypes", where),
        output_dtypes=_strs(raw.get("output_dtypes"), "output_dtypes", where),
        state=state,
        retired=bool(raw.get("retired", False)),
        is_p2p=bool(raw.get("is_p2p", False)),
        time_created_ns=_int(raw.get("time_created_ns"), "time_created_ns", where, 0),
        started=started,
        completed=completed,
        frames=None if frames is None else _frames(frames, where),
    )


def looks_like_dump(value: Any) -> bool:
    """Whether decoded plain values have a dump's top level."""
    return (
        isinstance(value, dict)
        and "version" in value
        and ("entries" in value or "pg_config" in value)
    )


def parse_dump(value: Any, name: str) -> FrDump:
    """A decoded dump (plain values), checked into an :class:`FrDump`.

    Raises:
        FlightDumpError: not a dump, or an entry that does not read.
    """
    if not looks_like_dump(value):
        raise FlightDumpError(f"{name}: not a Flight Recorder dump (no version / entries)")
    version = str(value.get("version"))
    lib = value.get("comm_lib_version", value.get("nccl_version", ""))
    raw_entries = value.get("entries") or []
    if not isinstance(raw_entries, list | tuple):
        raise FlightDumpError(f"{name}: entries is not a list")
    entries = tuple(parse_entry(e, f"{name}: entry {i}") for i, e in enumerate(raw_entries))
    groups: dict[str, tuple[int, ...]] = {}
    descs: dict[str, str] = {}
    config = value.get("pg_config") or {}
    if isinstance(config, dict):
        for key, info in config.items():
            if not isinstance(info, dict):
                continue
            gname = info.get("name", key)
            ranks = parse_ranks(info.get("ranks"))
            if isinstance(gname, str) and gname and ranks:  # gloo leaves it broken
                groups[gname] = ranks
                descs[gname] = str(info.get("desc", ""))
    return FrDump(
        version=version,
        comm_lib_version=str(lib),
        groups=groups,
        group_descs=descs,
        entries=entries,
        has_frames=any(e.frames is not None for e in entries),
    )
