"""The per-rank trace file: an append-only JSON Lines file written one record per syscall.

Each record goes to the kernel with a single ``os.write`` on an ``O_APPEND`` descriptor,
and the record of an operation is written *before* the operation is issued: a gloo size
mismatch aborts the process from a gloo thread within milliseconds, with no Python
handler and no atexit, so anything still buffered in user space would be lost.

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


class TraceWriter:
    """Appends records to one rank's trace file.

    Args:
        run_dir: the run directory (created if missing).
        rank: global rank of this process.
        world_size: size of the default group.
        backend: the inner backend the records describe ("gloo").
        torch_version: ``torch.__version__`` (recorded in the header).
        emulate: the emulated send semantics (``dl2.record.emulate``) as
            ``(eager_bytes, fused_batches)``, or None.

    Attributes:
        path: the trace file, or None when it could not be opened.
        enabled: False once a write failed; later writes are dropped.
        t0: ``time.monotonic_ns()`` when the file was opened.
        fd: the open descriptor, or -1.
    """

    def __init__(
        self,
        run_dir: str,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        torch_version: str = "",
        emulate: tuple[int, bool] | None = None,
    ) -> None:
        self.rank = rank
        self.pid = os.getpid()
        self.enabled = False
        self.path: str | None = None
        self.t0 = time.monotonic_ns()
        self.fd = -1
        self._reported = False
        try:
            os.makedirs(run_dir, exist_ok=True)
            path = os.path.join(run_dir, trace_file_name(rank, self.pid))
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self.path = path
            self.enabled = True
            header = header_line(
                rank=rank,
                world_size=world_size,
                pid=self.pid,
                host=socket.gethostname(),
                t0=self.t0,
                wall=time.time_ns(),
                dl2=__version__,
                torch=torch_version,
                backend=backend,
                argv=sys.argv,
                emulate=emulate,
            )
            self.write_line(header)
        except OSError as err:
            self.fail(err)

    def write_line(self, line: str) -> None:
        """Append one record line from :mod:`dl2.trace.schema.encode`."""
        self.write_bytes(line.encode())

    def write_bytes(self, data: bytes) -> None:
        """Append one already-encoded record line (must end with a newline)."""
        if not self.enabled:
            return
        try:
            # A regular file accepts the whole buffer or fails: no partial-write loop.
            os.write(self.fd, data)
        except OSError as err:
            self.fail(err)

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
        """The file's current size in bytes (-1 if unknown): grows with every record."""
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
