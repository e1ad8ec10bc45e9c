"""Sharing live state between the monitors of a multi-node job, through the job's store.

When each node runs its own ``dl2 run -- torchrun --nnodes N --node-rank K ...``, every
monitor sees only its node's trace files.  The monitors then meet in the job's own c10d
``TCPStore`` (the rendezvous endpoint torchrun's agents share with their workers): no
server of dl2's own, only the store's ``set``/``get``/``add``/``append``/``check``
operations, on keys under ``dl2/<run id>/``:

``nodes``                 counter: each monitor takes its node number from it (1, 2, ...)
``node/<k>``              JSON: host, pid and run directory of node k's monitor
``node/<k>/states``       JSON: rank -> process state of node k's ranks
``node/<k>/seen``         the ``req`` value node k read before its last push (see below)
``files``                 names of the mirrored trace files, one per line (``append``)
``f/<name>/n``            counter: chunks of that file pushed so far
``f/<name>/<i>``          chunk i: complete record lines, in file order (deleted once
                          the reporting monitor has read it)
``req``                   counter the reporting monitor bumps after each snapshot
``verdict``, ``report``   the reporting monitor's verdict (JSON) and JSON report
``ack``                   counter: monitors that have seen the verdict

Exactly one monitor reports: the one whose node runs global rank 0 (the *leader*).  The
others mirror their files, follow the verdict it publishes, and stop their own ranks.
The leader keeps the files it receives in its run directory's ``mirrored/`` folder, as
they came: a later ``dl2 analyze`` of that directory reads every node's traces, up to
where the live analysis read them.

A deadlock proof needs two snapshots in which no member moved, the second read after
the first.  A member on another node is read by that node's monitor, so the leader
bumps ``req`` after each snapshot and compares only once every node holding a member
has pushed with a ``seen`` at least that value: those files were read after the first
snapshot was complete.

torch is imported (in a background thread, as it takes seconds) only when sharing is
needed.  Any store error ends the sharing for good: the store lives in node 0's
torchrun agent and goes when it does; the monitor then says so and carries on with its
own node's traces.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from typing import Protocol

from dl2.live.tailer import TraceTailer
from dl2.trace.session import MIRRORED_DIR

#: seconds a store operation may take before the store counts as gone
STORE_TIMEOUT_S = 5.0
#: how long to keep trying to reach the store once this node's ranks have started
#: (they exist, so the store does)
CONNECT_DEADLINE_S = 30.0


class StoreClient(Protocol):
    """The subset of ``torch.distributed.Store`` used here (a TCPStore client)."""

    def set(self, key: str, value: bytes | str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def add(self, key: str, amount: int) -> int: ...

    def append(self, key: str, value: bytes | str) -> None: ...

    def check(self, keys: list[str]) -> bool: ...

    def multi_get(self, keys: list[str]) -> list[bytes]: ...

    def delete_key(self, key: str) -> bool: ...


@dataclass(frozen=True)
class StoreAddress:
    """Where the job's store is and which job it is.

    Attributes:
        host, port: the TCPStore (torchrun's rendezvous endpoint).
        run_id: the job's rendezvous id (``--rdzv-id``), part of the key prefix.
        origin: how it was found, for messages ("--rdzv-endpoint", "--store").
    """

    host: str
    port: int
    run_id: str = "none"
    origin: str = "--store"

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


# -- finding the store in a torchrun command line ------------------------------------------

_TORCHRUN_FLAGS = frozenset(
    {"--standalone", "--module", "-m", "--no-python", "--no_python", "--run-path", "--run_path"}
)
_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _launcher_args(command: Sequence[str]) -> list[str] | None:
    """torchrun's own arguments in ``command`` (before the script), or None."""
    if not command:
        return None
    args = list(command)
    if os.path.basename(args[0]) == "torchrun":
        args = args[1:]
    else:
        # python [-u ...] -m torch.distributed.run ARGS
        try:
            module = args.index("-m")
        except ValueError:
            return None
        if module + 1 >= len(args) or args[module + 1] not in _TORCHRUN_MODULES:
            return None
        args = args[module + 2 :]
    own: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("-"):
            break  # the training script
        own.append(arg)
        if "=" not in arg and arg not in _TORCHRUN_FLAGS and index + 1 < len(args):
            own.append(args[index + 1])
            index += 1
        index += 1
    return own


def _option(args: Sequence[str], *names: str) -> str | None:
    value = None
    for index, arg in enumerate(args):
        key, sep, inline = arg.partition("=")
        if key in names:
            if sep:
                value = inline
            elif index + 1 < len(args):
                value = args[index + 1]
    return value


def store_from_command(command: Sequence[str]) -> StoreAddress | None:
    """The job's store for a multi-node torchrun command, or None if single-node.

    Reads ``--nnodes`` (``N`` or ``MIN:MAX``), ``--rdzv-endpoint`` (else
    ``--master-addr``/``--master-port``) and ``--rdzv-id``.

    Raises:
        ValueError: multi-node, but the store's address cannot be told.
    """
    args = _launcher_args(command)
    if args is None or "--standalone" in args:
        return None
    nnodes = _option(args, "--nnodes") or "1"
    try:
        most = int(nnodes.split(":")[-1])
    except ValueError:
        return None
    if most <= 1:
        return None
    run_id = _option(args, "--rdzv-id", "--rdzv_id") or "none"
    endpoint = _option(args, "--rdzv-endpoint", "--rdzv_endpoint")
    if endpoint:
        host, _, port = endpoint.rpartition(":")
        if not host:
            backend = _option(args, "--rdzv-backend", "--rdzv_backend") or "static"
            host, port = endpoint, "29400" if backend == "c10d" else "29500"
        try:
            return StoreAddress(host.strip("[]"), int(port), run_id, "--rdzv-endpoint")
        except ValueError:
            raise ValueError(
                f"cannot read the store's port from --rdzv-endpoint {endpoint}"
            ) from None
    addr = _option(args, "--master-addr", "--master_addr")
    port = _option(args, "--master-port", "--master_port") or "29500"
    if addr:
        try:
            return StoreAddress(addr, int(port), run_id, "--master-addr")
        except ValueError:
            raise ValueError(f"cannot read --master-port {port}") from None
    raise ValueError("a multi-node torchrun command without --rdzv-endpoint or --master-addr")


def parse_store(text: str) -> StoreAddress:
    """``HOST:PORT[/RUN_ID]`` as given to ``--store``."""
    address, _, run_id = text.partition("/")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT (a port of 1-65535), got {text!r}")
    return StoreAddress(host.strip("[]"), int(port), run_id or "none", "--store")


#: torch's C++ log level, read once when torch is first imported
ENV_CPP_LOG_LEVEL = "TORCH_CPP_LOG_LEVEL"


def connect_tcp_store(address: StoreAddress) -> StoreClient:
    """A client of the job's TCPStore (imports torch).

    The monitor's own torch logs only C++ errors: when node 0's agent exits, the store
    goes with it, and the client's next call would print a warning with a 20-frame C++
    stack into ``dl2 run``'s output (the monitor says in one line that sharing ended).
    The job was launched before this runs, with its own environment, and keeps its
    level; a level the user set is kept too.
    """
    quiet = "torch" not in sys.modules and ENV_CPP_LOG_LEVEL not in os.environ
    if quiet:
        os.environ[ENV_CPP_LOG_LEVEL] = "ERROR"
    try:
        from torch.distributed import TCPStore
    finally:
        if quiet:
            os.environ.pop(ENV_CPP_LOG_LEVEL, None)

    store: StoreClient = TCPStore(
        address.host,
        address.port,
        is_master=False,
        wait_for_workers=False,
        timeout=timedelta(seconds=STORE_TIMEOUT_S),
    )
    return store


# -- the shared state ----------------------------------------------------------------------


@dataclass(frozen=True)
class Pull:
    """What one sync learnt from the other nodes.

    Attributes:
        states: rank -> process state, for the other nodes' ranks.
        seen: node -> the ``req`` value it read before its last push.
        rank_nodes: rank -> the node whose monitor mirrors it.
        changed: some mirrored record or state was new.
    """

    states: Mapping[int, str]
    seen: Mapping[int, int]
    rank_nodes: Mapping[int, int]
    changed: bool


class SharedState:
    """One monitor's link to the others through the job's store.

    Args:
        address: the job's store.
        run_dir: this monitor's run directory (published for the others' messages).
        connect: makes the store client (a TCPStore by default; tests pass a fake).
    """

    def __init__(
        self,
        address: StoreAddress,
        run_dir: str,
        connect: Callable[[StoreAddress], StoreClient] = connect_tcp_store,
    ) -> None:
        self.address = address
        self.prefix = f"dl2/{address.run_id}/"
        self.run_dir = run_dir
        self._connect = connect
        self._client: StoreClient | None = None
        self._thread: threading.Thread | None = None
        self._connect_error: str | None = None
        self._stop = threading.Event()
        self.node = 0  # this monitor's node number, once registered
        self.lost: str | None = None  # why sharing ended, once it did
        self.req = 0  # the last req value this monitor read or published
        self._chunks: dict[str, int] = {}  # mirrored file -> chunks pulled (or pushed)
        self._remote_files: set[str] = set()  # files mirrored from other nodes
        self._states: dict[int, str] = {}
        self._rank_nodes: dict[int, int] = {}
        self._pushed_states: str | None = None
        self._info: str | None = None
        self._verdict_seq = -1
        self._keep_failed = False  # a mirrored chunk could not be kept in the run dir

    # -- connection ---------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background (importing torch takes seconds)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._connect_loop, daemon=True)
            self._thread.start()

    def _connect_loop(self) -> None:
        while self._client is None and not self._stop.is_set():
            try:
                client = self._connect(self.address)
                self.node = int(client.add(self.prefix + "nodes", 1))
                self._client = client
            except Exception as err:  # torch missing, store not up yet, refused
                self._connect_error = f"{type(err).__name__}: {err}".splitlines()[0][:200]
                self._stop.wait(0.5)

    @property
    def ready(self) -> bool:
        """Connected and not lost."""
        return self._client is not None and self.lost is None

    def give_up(self) -> str:
        """Stop trying to connect; returns the last error, for the message."""
        self._stop.set()
        if self.lost is None:
            self.lost = self._connect_error or "no answer"
        return self.lost

    def _lose(self, err: BaseException) -> None:
        if self.lost is None:
            text = f"{type(err).__name__}: {err}".splitlines()[0][:200]
            self.lost = text
            self._stop.set()

    def _key(self, name: str) -> str:
        return self.prefix + name

    # -- the monitors' exchange ---------------------------------------------------------

    def sync(self, tailer: TraceTailer, states: Mapping[int, str], read_files: bool) -> Pull | None:
        """Push this node's new records and rank states, then pull the other nodes'.

        ``states`` must have been taken before ``tailer`` read its files (so an exited
        rank's file is complete).  Only the reporting monitor reads the other nodes'
        files (``read_files``), and only the others push theirs; it deletes each chunk
        once read, so the job's store holds only what is in flight.  Returns None when
        not connected (or lost).
        """
        client = self._client
        if client is None or self.lost is not None:
            return None
        try:
            req = int(client.add(self._key("req"), 0))
            self._push(client, tailer, states, req, push_files=not read_files)
            return self._pull(client, tailer, read_files)
        except Exception as err:
            self._lose(err)
            return None

    def _push(
        self,
        client: StoreClient,
        tailer: TraceTailer,
        states: Mapping[int, str],
        req: int,
        push_files: bool,
    ) -> None:
        info = json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "run_dir": self.run_dir,
                "ranks": sorted(tailer.local_ranks()),
            }
        )
        if info != self._info:
            client.set(self._key(f"node/{self.node}"), info)
            self._info = info
        drained = tailer.drain()  # the reporting monitor's own files go nowhere
        for name, data in drained.items() if push_files else ():
            count = self._chunks.get(name, 0)
            client.set(self._key(f"f/{name}/{count}"), data)
            client.add(self._key(f"f/{name}/n"), 1)
            if count == 0:
                client.append(self._key("files"), f"{name}\n")
            self._chunks[name] = count + 1
        local = {str(r): s for r, s in states.items() if r in tailer.local_ranks()}
        text = json.dumps(local, sort_keys=True)
        if text != self._pushed_states:
            client.set(self._key(f"node/{self.node}/states"), text)
            self._pushed_states = text
        client.set(self._key(f"node/{self.node}/seen"), str(req))

    def _pull(self, client: StoreClient, tailer: TraceTailer, read_files: bool) -> Pull:
        changed = False
        nodes = int(client.add(self._key("nodes"), 0))
        seen: dict[int, int] = {}
        for node in range(1, nodes + 1):
            if node == self.node:
                continue
            keys = [self._key(f"node/{node}/seen"), self._key(f"node/{node}/states")]
            if not client.check(keys):
                continue  # registered, not pushed yet
            raw_seen, raw_states = client.multi_get(keys)
            seen[node] = int(raw_seen)
            for rank, state in json.loads(raw_states).items():
                if self._states.get(int(rank)) != state:
                    self._states[int(rank)] = str(state)
                    changed = True
                self._rank_nodes[int(rank)] = node
        if not read_files:
            return Pull(dict(self._states), seen, dict(self._rank_nodes), changed)
        if client.check([self._key("files")]):
            listing = client.get(self._key("files"))
            local = tailer.local_names()
            for name in listing.decode().split():
                if name not in local:
                    self._remote_files.add(name)
        for name in self._remote_files:
            have = self._chunks.get(name, 0)
            count = int(client.add(self._key(f"f/{name}/n"), 0))
            if count > have:
                keys = [self._key(f"f/{name}/{i}") for i in range(have, count)]
                for chunk in client.multi_get(keys):
                    self._keep(name, bytes(chunk))
                    if tailer.ingest(name, bytes(chunk)):
                        changed = True
                self._chunks[name] = count
                for key in keys:
                    client.delete_key(key)
        return Pull(dict(self._states), seen, dict(self._rank_nodes), changed)

    def _keep(self, name: str, data: bytes) -> None:
        """Append a mirrored chunk to its copy in the run directory, so that a later
        ``dl2 analyze`` of it reads what this monitor read (best effort: a failed write
        ends the copies, never the monitoring)."""
        if self._keep_failed or not data:
            return
        try:
            folder = os.path.join(self.run_dir, MIRRORED_DIR)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, os.path.basename(name)), "ab") as handle:
                handle.write(data)
        except OSError:
            self._keep_failed = True

    def remote_names(self) -> set[str]:
        return set(self._remote_files)

    def bump(self) -> int:
        """Mark the end of a snapshot: other nodes' later pushes read their files after it."""
        client = self._client
        if client is None or self.lost is not None:
            return self.req
        try:
            self.req = int(client.add(self._key("req"), 1))
        except Exception as err:
            self._lose(err)
        return self.req

    # -- the verdict --------------------------------------------------------------------

    def publish_verdict(self, verdict: Mapping[str, Any], report_json: str | None) -> None:
        """Tell the other monitors (the report first, then the verdict that points at it)."""
        client = self._client
        if client is None or self.lost is not None:
            return
        try:
            if report_json is not None:
                client.set(self._key("report"), report_json)
            self._verdict_seq += 1
            body = dict(verdict, seq=self._verdict_seq, node=self.node, run_dir=self.run_dir)
            body.setdefault("host", socket.gethostname())
            client.set(self._key("verdict"), json.dumps(body))
        except Exception as err:
            self._lose(err)

    def wait_for_acks(self, timeout: float) -> bool:
        """Wait until every other registered monitor has seen the verdict (or timeout)."""
        client = self._client
        if client is None or self.lost is not None:
            return False
        deadline = time.monotonic() + timeout
        try:
            while True:
                others = int(client.add(self._key("nodes"), 0)) - 1
                if int(client.add(self._key("ack"), 0)) >= others:
                    return True
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
        except Exception as err:
            self._lose(err)
            return False

    def verdict(self) -> dict[str, Any] | None:
        """A verdict another monitor published and this one has not seen yet."""
        client = self._client
        if client is None or self.lost is not None:
            return None
        try:
            if not client.check([self._key("verdict")]):
                return None
            body = json.loads(client.get(self._key("verdict")))
            if not isinstance(body, dict) or body.get("node") == self.node:
                return None
            seq = int(body.get("seq", 0))
            if seq <= self._verdict_seq:
                return None
            self._verdict_seq = seq
            return body
        except Exception as err:
            self._lose(err)
            return None

    def ack(self) -> None:
        client = self._client
        if client is None or self.lost is not None:
            return
        try:
            client.add(self._key("ack"), 1)
        except Exception as err:
            self._lose(err)

    def report_json(self) -> str | None:
        """The JSON report the leader published with its verdict, if any."""
        client = self._client
        if client is None or self.lost is not None:
            return None
        try:
            if client.check([self._key("report")]):
                return client.get(self._key("report")).decode()
        except Exception as err:
            self._lose(err)
        return None
