"""The per-rank trace: append-only JSON Lines segments, written one record per syscall.

Each record goes to the kernel with a single ``os.write`` on an ``O_APPEND`` descriptor,
and the record of an operation is written *before* the operation is issued: a gloo size
mismatch aborts the process from a gloo thread within milliseconds, with no Python
handler and no atexit, so anything still buffered in user space would be lost.

The trace is bounded: once a segment holds ``segment_bytes``, the next record opens a
new segment (header, then a checkpoint of what came before), and the segment ``keep``
places older is deleted.  ``DL2_SEGMENT_BYTES`` and ``DL2_KEEP`` (a number, or "all":
delete nothing) set both; the defaults bound a rank's trace to ``KEEP`` x
``SEGMENT_BYTES`` = 64 MiB on disk.

A writer never raises into the job: the first ``OSError`` (unwritable directory, disk
full, closed descriptor) disables it and prints one line to stderr.
"""

from __future__ import annotations

import os
import socket
import sys
import time

from dl2._version import __version__
from dl2.trace.format import trace_file_name
from dl2.trace.schema.encode import header_line

ENV_SEGMENT_BYTES = "DL2_SEGMENT_BYTES"
ENV_KEEP = "DL2_KEEP"
#: A new segment once the current one holds this many bytes.
SEGMENT_BYTES = 16 << 20
#: Segments kept (the newest); older ones are deleted.
KEEP = 4


def retention_from_env() -> tuple[int, int]:
    """``(segment_bytes, keep)`` from the environment (keep 0: every segment)."""
    try:
        size = int(os.environ.get(ENV_SEGMENT_BYTES, "") or SEGMENT_BYTES)
    except ValueError:
        size = SEGMENT_BYTES
    text = os.environ.get(ENV_KEEP, "").strip().lower()
    try:
        keep = 0 if text == "all" else int(text or KEEP)
    except ValueError:
        keep = KEEP
    return max(size, 1024), max(keep, 0)


#: set by a rank's recorder to its pid: a process that inherits it descends from a rank
ENV_RANK_PID = "DL2_RANK_PID"
#: set by ``dl2 run`` for its job: the run's id, in every trace header
ENV_RUN_ID = "DL2_RUN_ID"
#: set by ``dl2 run`` for its job: the directory every process records into
ENV_RUN_DIR = "DL2_RUN_DIR"


#: files a launcher process of the job leaves in the run directory (one per launcher,
#: ``.exits.<its pid>``): a line ``<pid> <exit status>`` for each rank it saw fail
EXITS_PREFIX = ".exits."


def note_exit(run_dir: str, pid: int, status: int) -> None:
    """Note that the rank process ``pid`` ended with ``status`` (as ``waitpid`` tells
    it: minus the signal that ended it), seen by the launcher that reaped it (the
    status of a grandchild is lost to ``dl2 run`` otherwise).  Never raises."""
    try:
        path = os.path.join(run_dir, f"{EXITS_PREFIX}{os.getpid()}")
        with open(path, "a", encoding="ascii") as handle:
            handle.write(f"{int(pid)} {int(status)}\n")
    except Exception:
        pass


def read_exits(run_dir: str) -> dict[int, int]:
    """pid -> exit status of every rank a launcher noted (:func:`note_exit`); the
    first noted for a pid wins, a line that cannot be read is skipped."""
    found: dict[int, int] = {}
    try:
        names = [n for n in os.listdir(run_dir) if n.startswith(EXITS_PREFIX)]
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(run_dir, name), encoding="ascii", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and all(p.lstrip("-").isdigit() for p in parts):
                found.setdefault(int(parts[0]), int(parts[1]))
    return found


def rendezvous_mark(run_dir: str, pid: int) -> str:
    """The empty file a process leaves in the run directory as it enters torch's
    rendezvous (``init_process_group`` meeting the other ranks, before its group and
    its trace exist): the live monitor then knows it waits in communication, not in its
    own code."""
    return os.path.join(run_dir, f".rendezvous.{pid}")


class TraceWriter:
    """Appends records to one rank's trace, segment after segment.

    Args:
        run_dir: the run directory (created if missing).
        rank: global rank of this process.
        world_size: size of the default group.
        backend: the inner backend the records describe ("gloo").
        torch_version: ``torch.__version__`` (recorded in the header).
        emulate: the emulated send semantics (``dl2.record.emulate``) as
            ``(eager_bytes, fused_batches)``, or None.
        retain: ``(segment_bytes, keep)``; default :func:`retention_from_env`.

    Attributes:
        path: the current segment, or None when it could not be opened.
        enabled: False once a write failed; later writes are dropped.
        t0: ``time.monotonic_ns()`` when the first segment was opened (every segment's
            header carries it: record times are offsets from it).
        fd: the open descriptor, or -1.
        segment: the current segment's number.
        room: bytes the current segment may still take before the next record opens a
            new one.
    """

    def __init__(
        self,
        run_dir: str,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        torch_version: str = "",
        emulate: tuple[int, bool] | None = None,
        retain: tuple[int, int] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.world_size = world_size
        self.pid = os.getpid()
        self.ppid = os.getppid()
        self.enabled = False
        self.path: str | None = None
        self.t0 = time.monotonic_ns()
        self.wall = time.time_ns()
        self.fd = -1
        self.segment = 0
        self.segment_bytes, self.keep = retain or retention_from_env()
        self.room = self.segment_bytes
        self._reported = False
        self._header = (backend, torch_version, emulate, socket.gethostname())
        # a process started by a rank (and inheriting its environment) is its child: the
        # analysis prefers the rank's own trace to a helper's of the same world
        parent = os.environ.get(ENV_RANK_PID, "")
        self.child_of = int(parent) if parent.isdigit() and int(parent) != self.pid else None
        os.environ[ENV_RANK_PID] = str(self.pid)
        try:
            os.makedirs(run_dir, exist_ok=True)
        except OSError as err:
            self.fail(err)
            return
        self.open_segment(0, "")

    def _header_line(self, segment: int) -> str:
        backend, torch_version, emulate, host = self._header
        return header_line(
            rank=self.rank,
            world_size=self.world_size,
            pid=self.pid,
            host=host,
            t0=self.t0,
            wall=self.wall,
            dl2=__version__,
            torch=torch_version,
            backend=backend,
            argv=sys.argv,
            emulate=emulate,
            segment=segment,
            retain=(self.segment_bytes, self.keep),
            follows=True,
            follows_groups=True,
            child_of=self.child_of,
            run_id=os.environ.get(ENV_RUN_ID) or None,
            ppid=self.ppid,
        )

    def open_segment(self, segment: int, prologue: str) -> None:
        """Start segment ``segment`` with its header and ``prologue`` (one write), close
        the previous one and delete the one ``keep`` segments older."""
        path = os.path.join(self.run_dir, trace_file_name(self.rank, self.pid, segment))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as err:
            self.fail(err)
            return
        previous, self.fd, self.path = self.fd, fd, path
        self.segment = segment
        self.enabled = True
        self.room = self.segment_bytes
        if previous >= 0:
            try:
                os.close(previous)
            except OSError:
                pass
        self.write_line(self._header_line(segment) + prologue)
        if self.keep and segment >= self.keep:
            old = trace_file_name(self.rank, self.pid, segment - self.keep)
            try:
                os.unlink(os.path.join(self.run_dir, old))
            except OSError:
                pass

    def write_line(self, line: str) -> None:
        """Append lines from :mod:`dl2.trace.schema` (one write)."""
        self.write_bytes(line.encode())

    def write_bytes(self, data: bytes) -> None:
        """Append already-encoded lines (ending with a newline) in one write."""
        if not self.enabled:
            return
        try:
            # A regular file accepts the whole buffer or fails: no partial-write loop.
            os.write(self.fd, data)
        except OSError as err:
            self.fail(err)
            return
        self.room -= len(data)

    def close(self) -> None:
        """Close the file; later writes are dropped silently."""
        self.enabled = False
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1

    def size(self) -> int:
        """The current segment's size in bytes (-1 if unknown): changes with every
        record (and with the segment)."""
        try:
            return os.fstat(self.fd).st_size if self.fd >= 0 else -1
        except OSError:
            return -1

    def fail(self, err: OSError) -> None:
        """Disable the writer after ``err`` and print the one-line notice (once)."""
        self.close()
        if not self._reported:
            self._reported = True
            reason = err.strerror or str(err)
            if err.filename:
                reason = f"{err.filename}: {reason}"
            try:
                print(
                    f"dl2: recording disabled on rank {self.rank}: {reason}; the job continues",
                    file=sys.stderr,
                    flush=True,
                )
            except (OSError, ValueError):
                pass
