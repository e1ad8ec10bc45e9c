"""Finding Flight Recorder dumps and reading them into a :class:`Session`.

A dump holds no rank: as PyTorch's own analyzer does, the rank is the number that ends
the file's name (``nccl_trace_rank_3``, ``comm_lib_trace_rank_3``, any prefix).  The
input is a directory of dumps or a list of files; what a file is, is told by its
content (a pickle or a JSON object with a dump's keys), not by its name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from dl2.errors import NoDataError
from dl2.flight.dump import KNOWN_VERSIONS
from dl2.flight.dump import FrDump
from dl2.flight.dump import looks_like_dump
from dl2.flight.dump import parse_dump
from dl2.flight.mapping import launched
from dl2.flight.mapping import map_rank
from dl2.flight.safe import JSON
from dl2.flight.safe import FlightDumpError
from dl2.flight.safe import loads
from dl2.flight.safe import read_bytes
from dl2.flight.safe import sniff
from dl2.trace.format import TRACE_SUFFIX
from dl2.trace.format import RankTrace
from dl2.trace.schema import FORMAT_VERSION
from dl2.trace.schema import MAGIC
from dl2.trace.schema.decode import Header
from dl2.trace.schema.decode import StateRecord
from dl2.trace.schema.decode import WaitRecord
from dl2.trace.session import EXITED
from dl2.trace.session import Session

#: how a set of dumps ends: each rank stood where its dump stops, as ranks stopped from
#: outside (a watchdog timeout, or the dump taken by hand at a hang)
ENDING = "hang-timeout"

#: the rank ends the file name, before an extension a dump may be given (torch writes
#: none; people save the JSON form as ``nccl_trace_rank_0.json``)
_RANK = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle|bin|dump))?$", re.IGNORECASE)


def dump_candidates(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The files to look at: those given, and the plain files of the directories given."""
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.is_file()))
        elif path.exists():
            files.append(path)
        else:
            raise NoDataError(f"{path}: no such file or directory")
    return files


def is_dl2_run(paths: Sequence[str | os.PathLike[str]]) -> bool:
    """One directory holding dl2 trace files (a run directory), or no dump at all."""
    if len(paths) != 1 or not Path(paths[0]).is_dir():
        return False
    try:
        return any(p.name.endswith(TRACE_SUFFIX) for p in Path(paths[0]).iterdir())
    except OSError:
        return True  # a directory it cannot list: the run reader says why, in one line


def is_flight_input(paths: Sequence[str | os.PathLike[str]]) -> bool:
    """Whether the paths hold Flight Recorder dumps rather than a dl2 run: several
    paths, or one that is a file or a directory with a dump and no dl2 trace."""
    if len(paths) != 1:
        return True
    if is_dl2_run(paths):
        return False
    try:
        return any(_is_dump(p) for p in dump_candidates(paths))
    except NoDataError:
        return False


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:
            return handle.read(64)
    except OSError:
        return b""


def read_dump(path: Path) -> FrDump:
    """One dump file, loaded safely and checked.

    Raises:
        FlightDumpError: unreadable, hostile, corrupt or not a dump.
    """
    form = sniff(_head(path))
    if form is None:
        raise FlightDumpError(f"{path}: neither a pickle nor a JSON dump")
    value = loads(read_bytes(path), form, str(path))
    try:
        return parse_dump(value, str(path))
    except FlightDumpError:
        raise
    except Exception as err:  # hostile values the schema check did not foresee
        raise FlightDumpError(f"{path}: not a readable dump ({type(err).__name__})") from None


def _is_dump(path: Path) -> bool:
    """Whether the file's content looks like a dump (JSON: its top level says so)."""
    form = sniff(_head(path))
    if form is None or path.name.endswith(TRACE_SUFFIX):
        return False
    if form == JSON:
        try:
            return looks_like_dump(loads(read_bytes(path), form, str(path)))
        except FlightDumpError:
            return False
    return True


def load_flight_session(paths: Sequence[str | os.PathLike[str]]) -> Session:
    """Every rank's dump read as a session the model and analyses read unchanged.

    Raises:
        NoDataError: no dump among the files.
        FlightDumpError: a dump that is hostile or corrupt, or two dumps of one rank.
    """
    files = [p for p in dump_candidates(paths) if _is_dump(p)]
    if not files:
        where = ", ".join(str(p) for p in paths)
        runs = [p for p in paths if Path(p).is_dir() and is_dl2_run([p])]
        if len(paths) > 1 and runs:
            raise NoDataError(
                f"{where}: give one run directory at a time (several paths are read as "
                "the Flight Recorder dumps of one job)"
            )
        raise NoDataError(f"{where}: no dl2 trace and no Flight Recorder dump found")
    dumps: dict[int, tuple[Path, FrDump]] = {}
    for path in files:
        match = _RANK.search(path.name)
        if match is None:
            raise FlightDumpError(
                f"{path}: a dump's rank is the number that ends its file name "
                "(nccl_trace_rank_<r>, or with .json/.pkl after it); this name has none"
            )
        rank = int(match.group(1))
        if rank in dumps:
            raise FlightDumpError(f"{path}: a second dump of rank {rank} ({dumps[rank][0]})")
        dumps[rank] = (path, read_dump(path))
    return build_flight_session(dumps, run_dir=", ".join(str(p) for p in paths))


def build_flight_session(
    dumps: dict[int, tuple[Path, FrDump]], run_dir: str | None = None
) -> Session:
    """The session of checked dumps (rank -> (file, dump))."""
    groups: dict[str, tuple[int, ...]] = {}
    notes: list[str] = []
    for _, (path, dump) in sorted(dumps.items()):
        for gid, members in dump.groups.items():
            known = groups.setdefault(gid, members)
            if known != members:
                notes.append(
                    f"group {gid}: pg_config gives ranks {list(known)} on one rank and "
                    f"{list(members)} in {path.name}; the first is used"
                )
    world = max(
        [len(groups["0"])] if "0" in groups else [],
        default=0,
    )
    world = max(world, max(dumps) + 1, *(max(m) + 1 for m in groups.values() if m))
    versions = sorted({d.version for _, d in dumps.values()})
    traces: dict[int, RankTrace] = {}
    backends: set[str] = set()
    wrapped: list[int] = []
    tops = {rank: launched(dump) for rank, (_, dump) in dumps.items()}
    # per group, (highest launch, rank) of each member with a dump, ascending: built once
    # for every rank (per rank and group it cost O(world), O(world^2) in all)
    launchers: dict[str, list[int]] = {}
    for r, top in tops.items():
        for gid in top:
            launchers.setdefault(gid, []).append(r)
    absent: dict[str, list[tuple[int, int]]] = {}
    for gid, ranks_on in launchers.items():
        members = groups.get(gid) or (tuple(dumps) if gid == "0" else tuple(ranks_on))
        absent[gid] = sorted((tops[m].get(gid, 0), m) for m in members if m in tops)
    gone: set[int] = set()
    for rank, (path, dump) in sorted(dumps.items()):
        try:
            read = map_rank(rank, dump, groups, path.name, absent)
        except Exception as err:  # values a checked schema still allows, but nonsense
            raise FlightDumpError(
                f"{path}: entries dl2 cannot map ({type(err).__name__}: {err})"[:300]
            ) from None
        gone.update(read.gone)
        if read.backend:
            backends.update(read.backend.split(","))
        if read.wrapped:
            wrapped.append(rank)
        header = Header(
            magic=MAGIC,
            format=FORMAT_VERSION,
            rank=rank,
            world_size=world,
            backend=read.backend or None,
            segment=1 if read.wrapped else 0,
        )
        traces[rank] = RankTrace(
            path=str(path),
            header=header,
            records=tuple(read.records),
            warnings=tuple(read.notes),
            segments=(str(path),),
        )
    head = [
        f"read from PyTorch Flight Recorder dumps ({len(dumps)} rank(s), schema "
        f"{', '.join(versions)}, backend {', '.join(sorted(backends)) or 'unknown'})"
    ]
    odd = [v for v in versions if v not in KNOWN_VERSIONS]
    if odd:
        head.append(f"schema version(s) {', '.join(odd)} not checked by this dl2; read as 2.10")
    if len(versions) > 1:
        head.append(f"the dumps mix schema versions {', '.join(versions)}")
    head.extend(_not_carried(dumps, backends, bool(groups)))
    for trace in traces.values():
        notes.extend(trace.warnings)
    # a rank whose absence failed a peer's gloo collective had left (gloo fails the
    # op with "Connection closed by peer"), unless it is itself waiting
    states: dict[int, str] = {}
    for rank in sorted(gone):
        left = traces.get(rank)
        waiting = left is not None and isinstance(
            left.records[-1] if left.records else None, WaitRecord | StateRecord
        )
        if left is not None and not waiting:
            states[rank] = EXITED
            notes.append(
                f"rank {rank}: a collective it never launched failed on its peers (gloo "
                "closes a connection when a process ends): read as having exited"
            )
    return Session(
        traces=traces,
        process_states=states,
        warnings=tuple(head + notes),
        run_dir=run_dir,
        ending=ENDING,
    )


def _not_carried(
    dumps: dict[int, tuple[Path, FrDump]], backends: set[str], have_groups: bool
) -> list[str]:
    """What FR does not record, as far as it matters for these dumps."""
    facts = [
        "FR does not record where a rank's program blocked: each rank is read as waiting "
        "on its earliest incomplete launch; nor broadcast/reduce roots, reduce ops or P2P tags"
    ]
    if "gloo" in backends:
        facts.append(
            "on gloo, FR records no P2P ops and no completion (state stays 'scheduled'): "
            "an op counts as complete once retired"
        )
    if not have_groups:
        facts.append(
            "pg_config names no group's ranks (gloo leaves it empty): a group's members "
            "are read as the ranks that launched on it"
        )
    no_frames = sorted(r for r, (_, d) in dumps.items() if d.entries and not d.has_frames)
    if no_frames:
        facts.append(
            f"the dumps of rank(s) {', '.join(map(str, no_frames))} carry no stack frames "
            "(JSON form, or dumped without stacks): their ops name no source line"
        )
    return facts
