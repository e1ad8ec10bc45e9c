"""Shared pieces of the evaluation benchmark: case headers and a plain (dl2-free) launcher.

A case (``benchmarks/cases/*.py``) or workload (``benchmarks/workloads/*.py``) is a plain
torch.distributed script with a header::

    # dl2-case: label=deadlock world=3 category=wildcard nondeterministic=1
    # dl2-expect: ranks=0,1,2

and ``# dl2: culprit`` at the end of each line whose call hangs or mismatches (see
``benchmarks/cases/README.md``).  :func:`launch` starts one like ``torchrun
--standalone`` would, without dl2: one process per rank, each in its own session (so a
hanging rank is killed with its children), ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` /
``MASTER_PORT`` in the environment, gloo on 127.0.0.1, ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import IO

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
CASES_DIR = BENCH / "cases"
WORKLOADS_DIR = BENCH / "workloads"
PYTHON = REPO / ".venv" / "bin" / "python"
if not PYTHON.exists():  # pragma: no cover - outside the repository's venv
    PYTHON = Path(sys.executable)
#: the ``dl2`` command of the repository's venv (``make install``)
DL2 = REPO / ".venv" / "bin" / "dl2"

HEADER = re.compile(r"^#\s*dl2-(case|expect):(.*)$")
CULPRIT = re.compile(r"#\s*dl2:\s*culprit\b")
LABELS = ("ok", "deadlock", "defect")


@dataclass(frozen=True)
class Case:
    """One script and the ground truth of its header.

    Attributes:
        path: the script.
        label: "deadlock", "defect" or "ok" (for a nondeterministic case: the worst
            outcome a run can have; see ``cases/README.md``).
        world: ranks to launch.
        category: bug class (or correct pattern).
        ranks: ranks the findings must name (empty for ok).
        culprits: 1-based line numbers marked ``# dl2: culprit``.
        nondeterministic: some runs show the bug, others complete correctly.
        suite: "cases" or "workloads".
        fields: every header field, as written.
    """

    path: Path
    label: str
    world: int
    category: str
    ranks: frozenset[int]
    culprits: tuple[int, ...]
    nondeterministic: bool = False
    suite: str = "cases"
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def positive(self) -> bool:
        return self.label != "ok"


def parse_case(path: Path) -> Case:
    """Read the ``dl2-case`` / ``dl2-expect`` header and culprit lines of ``path``."""
    fields: dict[str, str] = {}
    culprits = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        header = HEADER.match(line)
        if header:
            for item in header.group(2).split():
                key, sep, value = item.partition("=")
                if not sep:
                    raise ValueError(f"{path.name}:{number}: expected key=value, got {item!r}")
                fields[key] = value
        if CULPRIT.search(line):
            culprits.append(number)
    missing = {"label", "world", "category"} - fields.keys()
    if missing:
        raise ValueError(f"{path.name}: header lacks {sorted(missing)}")
    if fields["label"] not in LABELS:
        raise ValueError(f"{path.name}: label {fields['label']!r} not in {LABELS}")
    return Case(
        path=path,
        label=fields["label"],
        world=int(fields["world"]),
        category=fields["category"],
        ranks=frozenset(int(r) for r in fields.get("ranks", "").split(",") if r),
        culprits=tuple(culprits),
        nondeterministic=fields.get("nondeterministic", "0") == "1",
        suite=path.parent.name,
        fields=fields,
    )


def discover(suite_dirs: tuple[Path, ...] = (CASES_DIR, WORKLOADS_DIR)) -> list[Case]:
    cases = []
    for directory in suite_dirs:
        for path in sorted(directory.glob("*.py")):
            if path.name.startswith("_"):
                continue
            cases.append(parse_case(path))
    return cases


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_env(
    rank: int, world: int, port: int, extra: dict[str, str] | None = None
) -> dict[str, str]:
    env = dict(
        os.environ,
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the header, its rule, one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def start_logged(
    command: list[str],
    out: IO[bytes],
    env: dict[str, str],
    cwd: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own (killed with :func:`kill_group`), no
    stdin, stdout and stderr both to ``out``; ``preexec_fn`` runs in the child first
    (resource limits)."""
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=preexec_fn,
    )


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (one we started with a new session)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def signame(rc: int | None) -> str:
    if rc is None:
        return "running"
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit {rc}"


@dataclass
class PlainRun:
    """What one plain launch did.

    Attributes:
        codes: rank -> exit status (None: still running at the cap, then killed).
        ended_at: rank -> seconds from launch to its exit.
        wall: seconds from launch to the last exit, or to the cap.
        logs: rank -> its combined stdout/stderr (tail).
        outdir: where the rank logs are.
        error_output_at: seconds from launch to the first error report any rank printed
            (a Python traceback or a glog error line), read every 0.25 s; None if none.
    """

    codes: dict[int, int | None]
    ended_at: dict[int, float]
    wall: float
    logs: dict[int, str]
    outdir: Path
    error_output_at: float | None = None

    @property
    def hung(self) -> list[int]:
        return [r for r, c in self.codes.items() if c is None]

    @property
    def outcome(self) -> str:
        """ "hang", "exit 0" or "crash"."""
        if self.hung:
            return "hang"
        if all(c == 0 for c in self.codes.values()):
            return "exit 0"
        return "crash"

    def first_error_at(self) -> float | None:
        """Seconds to the first non-zero exit, if any."""
        times = [self.ended_at[r] for r, c in self.codes.items() if c not in (0, None)]
        return min(times) if times else None

    def first_signal_at(self) -> float | None:
        """Seconds to the first non-zero exit or printed error report, if any."""
        times = [t for t in (self.first_error_at(), self.error_output_at) if t is not None]
        return min(times) if times else None

    def describe(self) -> str:
        parts = []
        for rank in sorted(self.codes):
            code = self.codes[rank]
            when = self.ended_at.get(rank)
            parts.append(f"r{rank}:{signame(code)}" + (f"@{when:.1f}s" if when is not None else ""))
        return " ".join(parts)


def launch(
    script: Path,
    world: int,
    cap: float,
    extra_env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    on_tick: Callable[[float, dict[int, int | None]], bool] | None = None,
    keep_logs: int = 60,
    grace_after_tick: float = 0.0,
) -> PlainRun:
    """Run ``script`` on ``world`` ranks without dl2; kill whatever runs at ``cap`` s.

    ``on_tick(elapsed, codes)`` is called every 50 ms while a rank runs; when it returns
    True the ranks still running are given ``grace_after_tick`` s more, then killed.
    """
    port = free_port()
    outdir = Path(tempfile.mkdtemp(prefix="dl2-bench-plain-"))
    procs: dict[int, subprocess.Popen[bytes]] = {}
    start = time.monotonic()
    for rank in range(world):
        with (outdir / f"rank{rank}.log").open("wb") as out:
            procs[rank] = start_logged(
                [str(PYTHON), str(script), *args], out, rank_env(rank, world, port, extra_env)
            )
    codes: dict[int, int | None] = dict.fromkeys(procs)
    ended: dict[int, float] = {}
    stop_at = start + cap
    offsets = dict.fromkeys(procs, 0)
    error_at: float | None = None
    next_scan = start
    try:
        while True:
            now = time.monotonic()
            if error_at is None and now >= next_scan:
                next_scan = now + 0.25
                error_at = _scan_errors(outdir, offsets, now - start)
            for rank, proc in procs.items():
                if codes[rank] is None and proc.poll() is not None:
                    codes[rank] = proc.returncode
                    ended[rank] = now - start
            if all(c is not None for c in codes.values()) or now >= stop_at:
                break
            if on_tick is not None and on_tick(now - start, dict(codes)):
                stop_at = min(stop_at, now + grace_after_tick)
                on_tick = None
            time.sleep(0.05)
        wall = max(ended.values()) if len(ended) == world else time.monotonic() - start
        if error_at is None:
            error_at = _scan_errors(outdir, offsets, wall)
        # Read the logs before killing: a killed rank's peers print "Connection closed by
        # peer" tracebacks that the job itself never produced.
        logs = {}
        for rank in range(world):
            text = (outdir / f"rank{rank}.log").read_text(errors="replace")
            logs[rank] = "\n".join(text.splitlines()[-keep_logs:])
    finally:
        for proc in procs.values():
            kill_group(proc.pid)
            proc.wait()
    return PlainRun(
        codes=codes, ended_at=ended, wall=wall, logs=logs, outdir=outdir, error_output_at=error_at
    )


ERROR_OUTPUT = re.compile(rb"Traceback \(most recent call last\)|^\S*\[E\d{4} ", re.MULTILINE)


def _scan_errors(outdir: Path, offsets: dict[int, int], elapsed: float) -> float | None:
    """``elapsed`` if a rank log grew an error report since the last scan, else None."""
    found = None
    for rank, offset in offsets.items():
        try:
            with (outdir / f"rank{rank}.log").open("rb") as handle:
                handle.seek(max(0, offset - 64))
                chunk = handle.read()
        except OSError:
            continue
        offsets[rank] = offset + max(0, len(chunk) - min(offset, 64))
        if ERROR_OUTPUT.search(chunk):
            found = elapsed
    return found
