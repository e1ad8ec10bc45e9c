"""A Session: every rank's trace of one run, plus what the launcher saw of each process."""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from enum import StrEnum
from pathlib import Path
from typing import Any

from dl2.errors import NoDataError
from dl2.errors import TraceFormatError
from dl2.trace.format import TRACE_SUFFIX
from dl2.trace.format import RankTrace
from dl2.trace.format import read_trace_stream
from dl2.trace.format import stream_of
from dl2.trace.schema.decode import EndRecord
from dl2.trace.schema.decode import Header

RUN_META = "run.json"
#: Session.ending values for a job dl2 stopped (the user's interrupt included): the
#: traces end where each rank stood at the stop
STOP_REASONS = frozenset({"deadlock", "hang-timeout", "rank-failed", "interrupted"})
#: corrupt records of one file named one by one in the warnings; the rest are counted
MAX_SKIP_NOTES = 5


# Process states a launcher or monitor can attest for a rank.
class ProcessState(StrEnum):
    """What a launcher or monitor can attest of a rank's process (``run.json`` values)."""

    #: still running when the trace was read (or killed by dl2 after a verdict)
    ALIVE = "alive"
    #: ended on its own, exit status 0
    EXITED = "exited"
    #: ended on its own with a non-zero status or a signal
    FAILED = "failed"
    #: ended by a signal that comes from outside (SIGTERM, SIGKILL, SIGINT, SIGHUP), not
    #: sent by dl2: a launcher's timeout, the scheduler, the user's kill, the OOM killer
    KILLED = "killed"
    #: no launcher information (post-mortem on a bare directory)
    UNKNOWN = "unknown"


ALIVE = ProcessState.ALIVE
EXITED = ProcessState.EXITED
FAILED = ProcessState.FAILED
KILLED = ProcessState.KILLED
#: process states of a rank that ended other than cleanly
ENDED_BADLY = frozenset({FAILED, KILLED})
UNKNOWN = ProcessState.UNKNOWN


@dataclass(frozen=True)
class Session:
    """Every rank's trace of one run.

    Attributes:
        traces: rank -> its trace (a rotated one, whose oldest segments are gone,
            starts with its checkpoint).
        process_states: rank -> ALIVE | EXITED | FAILED | KILLED | UNKNOWN, as seen by the launcher
            or the live monitor; ranks absent here are UNKNOWN.
        warnings: problems met while loading (truncated records, duplicate ranks,
            corrupt records skipped, rotated history).
        run_dir: the directory it was read from, if any.
        ending: how the job ended, as the launcher or live monitor saw it (``run.json``'s
            ``reason``): "finished" (its processes ended on their own), "deadlock",
            "hang-timeout" or "rank-failed" (dl2 stopped it), "interrupted" (the user
            stopped dl2), or None when nothing is known (a bare directory).
    """

    traces: Mapping[int, RankTrace]
    process_states: Mapping[int, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    run_dir: str | None = None
    ending: str | None = None

    @property
    def world_size(self) -> int:
        sizes = [t.header.world_size for t in self.traces.values()]
        return max(sizes) if sizes else 0

    @property
    def ranks(self) -> list[int]:
        return sorted(self.traces)

    def rotated_ranks(self) -> list[int]:
        """Ranks whose oldest segments were rotated away (``dl2 run --keep all`` keeps them)."""
        return sorted(r for r, t in self.traces.items() if t.rotated)

    def require_whole_history(self, command: str) -> None:
        """Refuse a run whose history was rotated away, for a command that needs it.

        Raises:
            TraceFormatError: some rank's oldest segments are gone.
        """
        rotated = self.rotated_ranks()
        if rotated:
            ranks = ", ".join(str(r) for r in rotated)
            raise TraceFormatError(
                f"{command} needs every op of the run, but the oldest trace segments of "
                f"rank(s) {ranks} were rotated away; record it again with "
                "`dl2 run --keep all`"
            )

    def missing_ranks(self) -> list[int]:
        """Ranks of the world that left no (readable) trace file."""
        return [r for r in range(self.world_size) if r not in self.traces]

    def corrupt_records(self) -> int:
        """Corrupt records skipped in the middle of the traces, all ranks."""
        return sum(len(t.skipped) for t in self.traces.values())

    @property
    def stopped_from_outside(self) -> bool:
        """dl2 (a verdict, its hang timeout, the user's interrupt) ended the job."""
        return self.ending in STOP_REASONS

    def process_state(self, rank: int) -> str:
        """What is known of the rank's process; a clean ``end`` record means EXITED."""
        state = self.process_states.get(rank, UNKNOWN)
        if state in (UNKNOWN, ALIVE) and rank in self.traces:
            records = self.traces[rank].records
            last = records[-1] if records else None
            if isinstance(last, EndRecord) and last.how == "exit":
                return EXITED if state == UNKNOWN else state
        return state


#: the folder of a run directory where the reporting monitor of a multi-node job keeps
#: the other nodes' traces as their monitors sent them (see :mod:`dl2.live.shared`)
MIRRORED_DIR = "mirrored"


def discover_trace_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The per-rank trace files (segments) of a run directory, sorted by name (and so by
    rank): its own, and the other nodes' its monitor received (:data:`MIRRORED_DIR`)
    unless a file of that name is there itself (a run directory shared by the nodes)."""
    path = Path(run_dir)
    if not path.exists():
        raise NoDataError(f"{path}: no such run directory")
    if not path.is_dir():
        raise NoDataError(f"{path}: not a directory (give the run directory, not a file)")
    try:
        # sorted by name: comparing the paths themselves costs 30 times more
        with os.scandir(path) as entries:
            found = {e.name: path / e.name for e in entries if e.name.endswith(TRACE_SUFFIX)}
    except OSError as err:
        raise NoDataError(f"{path}: cannot list the run directory: {err.strerror}") from None
    mirrored = path / MIRRORED_DIR
    try:
        with os.scandir(mirrored) as entries:
            for e in entries:
                if e.name.endswith(TRACE_SUFFIX) and e.name not in found:
                    found[e.name] = mirrored / e.name
    except OSError:
        pass  # none (a single-node run), or unreadable: this node's files alone
    return [found[name] for name in sorted(found)]


def group_streams(files: list[Path]) -> list[list[Path]]:
    """The files grouped by the process that wrote them, each group in segment order."""
    streams: dict[str, list[tuple[int, Path]]] = {}
    for file in files:
        stem, segment = stream_of(file.name)
        streams.setdefault(stem, []).append((segment, file))
    return [[p for _, p in sorted(segments)] for _, segments in sorted(streams.items())]


def read_run_meta(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The launcher's ``run.json`` of a run directory, or {} if it has none (or, with
    the key ``unreadable``, why it could not be read: the traces are analysed without
    it, see :func:`meta_warnings`)."""
    meta_path = Path(run_dir) / RUN_META
    if not meta_path.exists():
        return {}
    try:
        data = json.loads(meta_path.read_text())
    except (OSError, ValueError) as err:
        return {"unreadable": f"{meta_path}: unreadable run metadata ({err}); read without it"}
    if not isinstance(data, dict):
        return {"unreadable": f"{meta_path}: run metadata of another shape; read without it"}
    return data


def meta_warnings(meta: Mapping[str, Any]) -> list[str]:
    """The warnings a run's ``run.json`` gives: it could not be read; it is one node's
    of a multi-node job whose report another node's monitor made (that node's run
    directory holds every node's traces)."""
    why = meta.get("unreadable")
    found = [why] if isinstance(why, str) else []
    leader = meta.get("reported_by")
    if isinstance(leader, dict) and isinstance(leader.get("run_dir"), str):
        host = leader.get("host")
        where = f" on {host}" if isinstance(host, str) and host else ""
        found.append(
            "this directory holds one node's traces of a multi-node job, whose report "
            f"the monitor of rank 0's node made: its run directory {leader['run_dir']}"
            f"{where} holds every node's traces"
        )
    return found


def read_limits(meta: Mapping[str, Any]) -> dict[str, int] | None:
    """File name -> bytes of it that the run's monitor had read when dl2 stopped the
    job (``read_upto`` of ``run.json``), or None: read every file whole.

    What the ranks wrote while they were being stopped (a peer's "Connection closed",
    the exit hook's ``end``) tells of the stop, not of the job: a later analysis stops
    where the live one did, and reaches the same verdict. A file not named was created
    after the stop.
    """
    limits = meta.get("read_upto")
    if not isinstance(limits, dict):
        return None
    return {str(k): v for k, v in limits.items() if isinstance(v, int) and v >= 0}


def run_files(
    run_dir: str | os.PathLike[str],
) -> tuple[dict[str, Any], dict[str, int] | None, list[Path]]:
    """A run directory's run.json, its read limits (:func:`read_limits`) and the trace
    files to read.

    Raises:
        NoDataError: no directory, or no trace file in it.
    """
    meta = read_run_meta(run_dir)
    limits = read_limits(meta)
    files = within_limits(discover_trace_files(run_dir), limits)
    if not files:
        raise NoDataError(f"{run_dir}: no dl2 trace files (*{TRACE_SUFFIX}) in this directory")
    return meta, limits, files


def of_other_runs(headers: Sequence[Header], meta: Mapping[str, Any]) -> list[str | None]:
    """Per header, why its file belongs to another run than the directory's (None: it
    may be this run's)."""
    run = _run_of(headers, meta)
    return [_foreign(header, run) for header in headers]


def _run_of(headers: Sequence[Header], meta: Mapping[str, Any]) -> str | None:
    """The run id the files of a run directory must carry: its run.json's, else the
    commonest among the headers (None: none is known, every file is read)."""
    given = meta.get("run_id")
    if isinstance(given, str) and given:
        return given
    counts: dict[str, int] = {}
    for header in headers:
        if header.run_id is not None:
            counts[header.run_id] = counts.get(header.run_id, 0) + 1
    return max(counts, key=lambda k: counts[k]) if counts else None


def _foreign(header: Header, run: str | None) -> str | None:
    """Why a file with ``header`` is not one of run ``run``'s, or None if it may be."""
    if run is None or header.run_id is None or header.run_id == run:
        return None
    return f"from another run (run id {header.run_id}, this run's is {run})"


def within_limits(files: list[Path], limits: dict[str, int] | None) -> list[Path]:
    """The files a run's analysis reads (see :func:`read_limits`); every file when the
    limits name none of them (a run.json edited or of another run).  A limit that does
    not fall at the end of a line (the file was edited since) is dropped from
    ``limits``: that file is read whole."""
    if limits is None:
        return files
    kept = [f for f in files if f.name in limits]
    for path in kept:
        at = limits[path.name]
        try:
            with open(path, "rb") as handle:
                handle.seek(max(at - 1, 0))
                last = handle.read(1)
        except OSError:
            continue  # the reader says why, in one line
        if at > 0 and last not in (b"\n", b""):
            del limits[path.name]
    return kept if kept else files


def preference(header: Header, traced: Collection[tuple[str, int]] = ()) -> tuple[int, bool, int]:
    """Which of a rank's trace files is its own, the greatest first: the one of the
    largest world (a rank's child process that runs a small job of its own, an eval
    with a one-process group, writes a trace for its "rank 0" too), then a rank's over
    a process a traced process started (``traced``: the (host, pid) of the run's traces; a
    checkpointing helper with a group of the same size, started before its rank's own
    trace opened or after), then the newest (a restarted rank)."""
    helper = header.child_of is not None or (
        header.ppid != 0 and (header.host, header.ppid) in traced
    )
    return (header.world_size, not helper, header.wall)


def build_session(
    traces: list[RankTrace],
    process_states: Mapping[int, str] | None = None,
    run_dir: str | None = None,
    warnings: list[str] | None = None,
    ending: str | None = None,
) -> Session:
    """Assemble a session from traces; when a rank has several, :func:`preference`
    picks its own."""
    notes = list(warnings or [])
    by_rank: dict[int, RankTrace] = {}
    traced = {(trace.header.host, trace.header.pid) for trace in traces}
    for trace in traces:
        previous = by_rank.get(trace.rank)
        if previous is not None:
            if preference(previous.header, traced) > preference(trace.header, traced):
                previous, trace = trace, previous
            kept, other = trace.header, previous.header
            if kept.world_size != other.world_size:
                why = f"world of {kept.world_size}, the largest"
            elif preference(kept, traced)[1] != preference(other, traced)[1]:
                why = "the rank's own process; the other is a process it started"
            else:
                why = f"world of {kept.world_size}, opened last"
            notes.append(
                f"rank {trace.rank} has several trace files; using "
                f"{os.path.basename(trace.path)} ({why}), not {os.path.basename(previous.path)}"
            )
        by_rank[trace.rank] = trace
    for rank, trace in sorted(by_rank.items()):
        notes.extend(trace.warnings)
        if trace.truncated:
            notes.append(f"rank {rank}: {trace.truncated}; the rank probably died while writing it")
        notes.extend(note for _, note in trace.skipped[:MAX_SKIP_NOTES])
        if len(trace.skipped) > MAX_SKIP_NOTES:
            notes.append(f"rank {rank}: {len(trace.skipped)} corrupt records skipped in all")
    sizes: dict[int, list[int]] = {}
    for rank, trace in sorted(by_rank.items()):
        sizes.setdefault(trace.header.world_size, []).append(rank)
    if len(sizes) > 1:
        told = "; ".join(
            f"rank(s) {', '.join(map(str, ranks))}: {size}" for size, ranks in sorted(sizes.items())
        )
        notes.append(
            f"the ranks were started with different world sizes ({told}): the job is read "
            f"as a world of {max(sizes)}, and a rank none started leaves no trace"
        )
    rotated = [str(rank) for rank, trace in sorted(by_rank.items()) if trace.rotated]
    if rotated:
        notes.append(
            f"rank(s) {', '.join(rotated)}: the oldest trace segments were rotated away; "
            "the analysis starts at each one's checkpoint (`dl2 predict` and `dl2 replay` "
            "need the whole run: `dl2 run --keep all`)"
        )
    return Session(
        traces=dict(sorted(by_rank.items())),
        process_states=dict(process_states or {}),
        warnings=tuple(notes),
        run_dir=run_dir,
        ending=ending,
    )


def load_session(run_dir: str | os.PathLike[str]) -> Session:
    """Load a run directory written by ``dl2 run`` (or any directory of trace files).

    Unreadable rank files are skipped with a warning, as long as one rank is readable.

    Raises:
        NoDataError: no directory, or no readable trace file in it.
    """
    meta, limits, files = run_files(run_dir)
    traces: list[RankTrace] = []
    warnings: list[str] = meta_warnings(meta)
    errors: list[str] = []
    for stream in group_streams(files):
        try:
            traces.append(read_trace_stream(stream, limits))
        except TraceFormatError as err:
            errors.append(str(err))
    others = of_other_runs([trace.header for trace in traces], meta)
    errors.extend(f"{t.path}: {why}" for t, why in zip(traces, others, strict=True) if why)
    traces = [t for t, why in zip(traces, others, strict=True) if why is None]
    if not traces:
        raise TraceFormatError(errors[0])
    warnings.extend(f"skipped {e}" for e in errors)
    return build_session(
        traces,
        run_states(meta),
        run_dir=str(run_dir),
        warnings=warnings,
        ending=run_ending(meta),
    )


def run_ending(meta: Mapping[str, Any]) -> str | None:
    """How the job ended, as a run's ``run.json`` (:func:`read_run_meta`) records it."""
    reason = meta.get("reason")
    return reason if isinstance(reason, str) else None


def run_quiet(meta: Mapping[str, Any]) -> dict[int, float]:
    """rank -> seconds without progress when the job ended, from a run's ``run.json``."""
    quiet: dict[int, float] = {}
    ranks = meta.get("ranks")
    for rank, entry in ranks.items() if isinstance(ranks, dict) else ():
        value = entry.get("quiet_s") if isinstance(entry, dict) else None
        if isinstance(value, int | float) and str(rank).isdigit():
            quiet[int(rank)] = float(value)
    return quiet


def run_states(meta: Mapping[str, Any]) -> dict[int, str]:
    """rank -> its process state as a run's ``run.json`` gives it."""
    ranks = meta.get("ranks")
    states: dict[int, str] = {}
    for rank, entry in ranks.items() if isinstance(ranks, dict) else ():
        if isinstance(entry, dict) and str(rank).isdigit():
            states[int(rank)] = str(entry.get("state", UNKNOWN))
    return states
