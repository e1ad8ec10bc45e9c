"""Starting the user's job with the recorder injected, and stopping it cleanly.

Two forms: ``-n N script.py`` starts N ranks like ``torchrun --standalone``; a raw
command (``torchrun ...``, ``python repro.py``) is started as is.  Either way the
bootstrap directory goes first on ``PYTHONPATH``, so every Python process of the job
installs the recorder before user code runs, with no change to the user's code.
Every process we start gets its own process group, which is how we stop it and its
children; rank processes a launcher started in sessions of their own are stopped by
the pid their trace header names.  Each run (``dl2 run``, ``dl2 replay``) writes its
traces into a run directory of its own, ``dl2-runs/<time>-<label>`` by default.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import dl2
from dl2.errors import ConfigError
from dl2.errors import LaunchError
from dl2.record.writer import ENV_RANK_PID
from dl2.record.writer import ENV_RUN_DIR
from dl2.record.writer import ENV_RUN_ID
from dl2.record.writer import rendezvous_mark
from dl2.trace.format import TRACE_SUFFIX

BOOTSTRAP_DIR = Path(dl2.__file__).parent / "_bootstrap"
#: where run directories go unless the user names one (under the working directory)
RUNS_DIR = Path("dl2-runs")


def new_run_dir(label: str, base: Path = RUNS_DIR) -> Path:
    """A fresh ``base/<time>-<label>`` directory (``-1``, ``-2``, ... if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1000):
        candidate = base / (f"{stamp}-{label}" + (f"-{attempt}" if attempt else ""))
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            continue
        except OSError as err:
            raise ConfigError(f"cannot create run directory {candidate}: {err.strerror}") from None
    raise ConfigError(f"cannot create a new run directory under {base}")


def prepare_run_dir(given: str | None, label: str) -> Path:
    """The directory ``--run-dir`` names (created if missing), else :func:`new_run_dir`.

    Raises:
        ConfigError: it cannot be created, or it holds another run's traces (the
            monitor reads every trace file of its run directory: an old run's would be
            taken for this job's, and two runs sharing one would blind each other).
    """
    if not given:
        return new_run_dir(label)
    run_dir = Path(given)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        used = next((p.name for p in run_dir.iterdir() if p.name.endswith(TRACE_SUFFIX)), None)
    except OSError as err:
        raise ConfigError(f"cannot create run directory {run_dir}: {err.strerror}") from None
    if used is not None:
        raise ConfigError(
            f"{run_dir} already holds a run's traces ({used}); give a new or empty directory"
        )
    return run_dir


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening_socket() -> socket.socket:
    """A socket listening on a free port of 127.0.0.1, held until the job's store takes
    it (:func:`host_store`): no other process can take the port in between, as one may
    take a port :func:`free_port` found free (the ephemeral ports of other jobs' gloo
    connections come from the same range)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


#: run directory -> its run's id (one per run started by this process)
_RUN_IDS: dict[str, str] = {}


def run_id(run_dir: Path, shared: str | None = None) -> str:
    """The id of the run writing into ``run_dir`` (made on first use): the recorder
    writes it in every header, so a trace file of another run is told apart.  A job
    on several nodes (one ``dl2 run`` each) gives ``shared``, what every node knows
    alike (its store's address and rendezvous id): their traces carry one id."""
    key = str(run_dir.resolve())
    found = _RUN_IDS.get(key)
    if found is None:
        made = uuid.uuid4().hex if shared is None else hashlib.sha1(shared.encode()).hexdigest()
        found = _RUN_IDS[key] = made[:16]
    return found


def recorder_env(run_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's environment: ours, plus the bootstrap on PYTHONPATH and dl2's settings."""
    env = dict(os.environ)
    paths = [str(BOOTSTRAP_DIR)]
    package_root = str(Path(dl2.__file__).parent.parent)
    if "site-packages" not in package_root and "dist-packages" not in package_root:
        paths.append(package_root)
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[ENV_RUN_DIR] = str(run_dir.resolve())
    env[ENV_RUN_ID] = run_id(run_dir)
    env.pop(ENV_RANK_PID, None)  # the job's ranks descend from no rank
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


class Job:
    """The processes of one launched job.

    Attributes:
        procs: rank -> process for ``-n`` launches, or {-1: the command} for raw commands.
        ranked: True when dl2 started the ranks itself (exit codes known per rank).
    """

    def __init__(self, procs: dict[int, subprocess.Popen[bytes]], ranked: bool) -> None:
        self.procs = procs
        self.ranked = ranked
        self.stopped_by_dl2 = False
        #: the job's c10d store server when dl2 hosts it (kept alive with the job)
        self.store: Any = None

    def poll(self) -> dict[int, int | None]:
        """key -> exit status (None while running)."""
        return {key: proc.poll() for key, proc in self.procs.items()}

    def finished(self) -> bool:
        return all(code is not None for code in self.poll().values())

    def exit_code(self) -> int:
        """The job's exit status: the first non-zero one, else 0."""
        codes = [c for c in self.poll().values() if c is not None]
        return next((c for c in codes if c != 0), 0)

    def stop(self, extra_pids: Iterable[int] = (), grace: float = 3.0) -> None:
        """Stop the job: SIGTERM to every process group we know, then SIGKILL after ``grace``."""
        self.stopped_by_dl2 = True
        groups = {proc.pid for proc in self.procs.values() if proc.poll() is None}
        for pid in extra_pids:
            groups.add(pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for group in groups:
                _signal_group(group, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and not self._all_gone(groups):
                time.sleep(0.05)
            if self._all_gone(groups):
                break
        for proc in self.procs.values():
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass

    def _all_gone(self, pids: Iterable[int]) -> bool:
        for proc in self.procs.values():
            proc.poll()
        return not any(process_alive(pid) for pid in pids)


def _signal_group(pid: int, sig: int) -> None:
    """Signal the process group led by ``pid``, or the process alone if it leads none."""
    try:
        os.killpg(pid, sig)
        return
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def has_children(pid: int) -> bool:
    """True if process ``pid`` on this host has a child process alive (Linux'
    ``/proc/PID/task/TID/children``; False when that cannot be read)."""
    return bool(_children(pid))


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` on this host (Linux'
    ``/proc/PID/task/TID/children``; none when that cannot be read)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found.extend(int(child) for child in handle.read().split())
        except (OSError, ValueError):
            continue
    return found


#: command-line words of multiprocessing's own helper processes (not ranks)
_HELPERS = (b"resource_tracker", b"semaphore_tracker", b"forkserver")


def starting_ranks(root: int, traced: Iterable[int], run_dir: Path) -> list[int]:
    """Processes of the job under ``root`` (the launcher dl2 started) that may be ranks
    still before ``init_process_group``: live Python processes that carry dl2's
    recording environment, have no trace, have not entered torch's rendezvous (no
    :func:`~dl2.record.writer.rendezvous_mark` in ``run_dir``: a rank that waits there
    for ranks that never come is in communication), and are neither a traced rank's
    ancestor (an agent, the script that spawned the ranks) nor its descendant (a data
    loader worker), nor one of multiprocessing's helpers."""
    traced = set(traced)
    parent: dict[int, int] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        for child in _children(pid):
            if child not in parent and child != root:
                parent[child] = pid
                todo.append(child)

    def lineage(pid: int) -> Iterable[int]:
        """``pid`` and its ancestors below ``root``."""
        while pid in parent:
            yield pid
            pid = parent[pid]

    traced_or_above = {at for pid in traced for at in lineage(pid)}
    found = []
    for pid in sorted(parent):
        if pid in traced_or_above or any(at in traced for at in lineage(pid)):
            continue  # a traced rank, its agent or spawner, or its worker
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        if not os.path.basename(argv[0]).startswith(b"python") or not process_alive(pid):
            continue
        if any(helper in word for word in argv for helper in _HELPERS):
            continue
        if b"\0" + ENV_RUN_DIR.encode() + b"=" in b"\0" + environ and not os.path.exists(
            rendezvous_mark(str(run_dir), pid)
        ):
            found.append(pid)
    return found


def process_alive(pid: int) -> bool:
    """True if ``pid`` runs on this host and is not a zombie."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def host_store(sock: socket.socket, world_size: int) -> Any:
    """The job's c10d store server on the listening socket ``sock`` (of 127.0.0.1),
    hosted in this process as torchrun's agent hosts it (imports torch; it serves until
    the object is dropped).  The store owns the socket from then on."""
    from torch.distributed import TCPStore

    port = int(sock.getsockname()[1])
    store = TCPStore(
        "127.0.0.1",
        port,
        world_size,
        True,
        timedelta(seconds=60),
        wait_for_workers=False,
        master_listen_fd=sock.fileno(),
    )
    sock.detach()  # closed by the store
    return store


def launch_ranks(
    script: str,
    args: Sequence[str],
    nproc: int,
    run_dir: Path,
    extra_env: Mapping[str, str] | None = None,
) -> Job:
    """Start ``nproc`` ranks of a Python script like ``torchrun --standalone``
    (``extra_env``: more variables for every rank, e.g. ``DL2_BUFFER_SIZE``).

    As under torchrun, the job's store is not rank 0's: dl2 hosts it
    (``TORCHELASTIC_USE_AGENT_STORE``), so that it outlives any rank, and a process
    group created again after ``destroy_process_group`` meets a store of the same kind
    as under torchrun (with rank 0 hosting it, such a re-init can hang where torchrun's
    job passes).
    """
    if not Path(script).is_file():
        raise LaunchError(f"script not found: {script}")
    if nproc < 1:
        raise LaunchError(f"-n must be at least 1, not {nproc}")
    agent = importlib.util.find_spec("torch") is not None
    # the store's socket listens from now on (connections queue until it serves); with
    # no torch here, rank 0 hosts the store and must find the port free
    listener = listening_socket() if agent else None
    port = str(listener.getsockname()[1] if listener is not None else free_port())
    elastic = (
        {
            "TORCHELASTIC_USE_AGENT_STORE": str(True),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": uuid.uuid4().hex,
        }
        if agent
        else {}
    )
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for rank in range(nproc):
        env = recorder_env(
            run_dir,
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "GROUP_RANK": "0",
                "ROLE_RANK": str(rank),
                "WORLD_SIZE": str(nproc),
                "LOCAL_WORLD_SIZE": str(nproc),
                "ROLE_WORLD_SIZE": str(nproc),
                **elastic,
                **(extra_env or {}),
            },
        )
        try:
            procs[rank] = subprocess.Popen(
                [sys.executable, "-u", script, *args], env=env, start_new_session=True
            )
        except OSError as err:
            Job(procs, ranked=True).stop()
            if listener is not None:
                listener.close()
            raise LaunchError(f"cannot start rank {rank}: {err.strerror}") from None
    job = Job(procs, ranked=True)
    if listener is not None:
        # after the ranks started: torch imports here while it imports there, and a
        # rank's store client waits for the server
        try:
            job.store = host_store(listener, nproc)
        except BaseException as err:
            job.stop()
            if listener.fileno() >= 0:
                listener.close()
            if isinstance(err, Exception):
                why = f"cannot host the job's store on 127.0.0.1:{port}: {err}"
                raise LaunchError(why) from None
            raise
    return job


def launch_command(
    command: Sequence[str], run_dir: Path, extra_env: Mapping[str, str] | None = None
) -> Job:
    """Start an arbitrary command (a launcher or a script that spawns its own ranks)."""
    if not command:
        raise LaunchError("no command given after --")
    try:
        proc = subprocess.Popen(
            list(command), env=recorder_env(run_dir, extra_env), start_new_session=True
        )
    except FileNotFoundError:
        raise LaunchError(f"command not found: {command[0]}") from None
    except OSError as err:
        raise LaunchError(f"cannot start {command[0]}: {err.strerror}") from None
    return Job({-1: proc}, ranked=False)
