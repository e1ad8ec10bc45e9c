"""Build rank traces in code, record by record, for analysis unit tests.

Records are written with the recorder's own stream encoder
(:mod:`dl2.trace.schema.stream`) and read back by the trace reader, so a built trace is
one a rank could have written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dl2.trace.format import RankTrace
from dl2.trace.format import TraceReader
from dl2.trace.format import read_trace_file
from dl2.trace.format import trace_file_name
from dl2.trace.schema import STORE_WAITS
from dl2.trace.schema import encode
from dl2.trace.schema.decode import record_to_dict
from dl2.trace.schema.stream import StackTable
from dl2.trace.schema.stream import StreamEncoder
from dl2.trace.session import Session
from dl2.trace.session import build_session

#: A stack as tests write it: ``[file, line, function]`` frames, innermost first.
Frames = Sequence[Sequence[Any]]


class RankBuilder:
    """Appends records of one rank; each op gets the user line ``file:line``.

    Attributes:
        records: the encoded records so far, one entry per record, with the definitions
            it needed before it (a test may drop the last one).
    """

    def __init__(self, rank: int, world: int, file: str = "train.py") -> None:
        self.rank = rank
        self.world = world
        self.file = file
        self.records: list[str] = []
        self.stacks = StackTable()
        self.encoder = StreamEncoder(rank, 0, self.stacks, self._collect)
        self._next_id = 0
        self._t = 0
        self._seq: dict[tuple[str, str], int] = {}

    def _collect(self, data: bytes) -> None:
        self.records.append(data.decode())

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _time(self) -> int:
        self._t += 1000
        return self._t

    def _stack(self, line: int, function: str, stack: Frames | None) -> int:
        """The id of ``stack``, or by default of the one frame ``file:line`` in
        ``function``."""
        frames = [(self.file, line, function)] if stack is None else stack
        return self.stacks.intern(
            encode.stack_of((str(f[0]), int(f[1]), str(f[2])) for f in frames)
        )

    def issue(
        self, op: str, line: int, gid: str = "0", returned: bool = True, **fields: Any
    ) -> int:
        """Write an op record and its ret (issued, not waited); return its id.

        ``fields`` are the op record's own (peer, root, tag, redop, dtype, count,
        splits, ranks, timeout, async, batch, eager, deferred, api), plus ``function``
        or a whole ``stack``, and ``tid`` (1).  ``returned=False`` leaves the rank inside the call.
        """
        op_id = self._id()
        kind = "p2p" if op in ("send", "recv") else op
        seq_key = (gid, kind if kind == "p2p" else "coll")
        seq = self._seq.get(seq_key, 0)
        self._seq[seq_key] = seq + 1
        api = fields.pop("api", op)
        stack = self._stack(line, fields.pop("function", "main"), fields.pop("stack", None))
        is_async = bool(fields.pop("async", False))
        batch = fields.pop("batch", None)
        eager, deferred = fields.pop("eager", False), fields.pop("deferred", False)
        tid = fields.pop("tid", 1)
        no_data = op in ("barrier", "create_group")
        fields.setdefault("dtype", None if no_data else "float32")
        fields.setdefault("count", None if no_data else 4)
        own = encode.op_fields(**fields)
        gid_json, t = encode.json_str(gid), self._time()
        peer, tag = fields.get("peer"), fields.get("tag") or 0
        self.encoder.op(
            op_id, t, tid, gid, gid_json, seq, op, api, own, is_async, stack,
            batch, eager, deferred, peer, tag,
        )  # fmt: skip
        if returned:
            self.ret(op_id)
        return op_id

    def ret(self, record_id: int, err: str | None = None, src: int | None = None) -> RankBuilder:
        """The ``ret`` of an op or wait (``err``: it raised)."""
        self.encoder.ret(record_id, self._time(), err, src)
        return self

    def wait(
        self,
        op_id: int,
        complete: bool = True,
        src: int | None = None,
        err: str | None = None,
        line: int | None = None,
        stack: Frames | None = None,
    ) -> RankBuilder:
        """A wait on ``op_id``: returned (``src``: a wildcard's sender; ``err``: it raised)
        or, with ``complete=False``, still waiting (``line``: where, else no stack;
        ``stack``: its frames instead)."""
        wait_id = self._id()
        sid = 0 if line is None and stack is None else self._stack(line or 0, "main", stack)
        self.encoder.wait(wait_id, self._time(), 1, op_id, sid)
        if complete:
            self.ret(wait_id, err, src)
        return self

    def call(self, op: str, line: int, gid: str = "0", complete: bool = True, **fields: Any) -> int:
        """A blocking call: issue then wait; ``complete=False`` leaves the rank stuck in it."""
        op_id = self.issue(op, line, gid, **fields)
        self.wait(op_id, complete=complete)
        return op_id

    def isend(self, line: int, peer: int, **fields: Any) -> int:
        """An isend (async, not waited yet); return its id."""
        return self.issue(
            "send", line, peer=peer, api=fields.pop("api", "isend"), **{"async": True}, **fields
        )

    def irecv(self, line: int, peer: int | None, **fields: Any) -> int:
        """An irecv (async, not waited yet; ``peer=None`` for any source); return its id."""
        return self.issue(
            "recv", line, peer=peer, api=fields.pop("api", "irecv"), **{"async": True}, **fields
        )

    def batch(self, ops: list[tuple[str, int, int]], **fields: Any) -> list[int]:
        """Ops of one batch_isend_irecv, ``(op, peer, line)`` each: async, sharing the
        first op's id as their batch id.  Returns their ids (wait on them after)."""
        batch_id = self._next_id + 1
        return [
            self.issue(
                op,
                line,
                peer=peer,
                api="batch_isend_irecv",
                batch=batch_id,
                **{"async": True},
                **fields,
            )
            for op, peer, line in ops
        ]

    def done(self, op_id: int, src: int | None = None) -> RankBuilder:
        """A ``done``: async op ``op_id`` was seen complete."""
        self.encoder.done(op_id, self._time(), src)
        return self

    def create_group(self, gid: str, ranks: list[int], line: int = 1, complete: bool = True) -> int:
        op_id = self._id()
        self.encoder.op(
            op_id,
            self._time(),
            1,
            gid,
            encode.json_str(gid),
            None,
            "create_group",
            "new_group",
            encode.ranks_field(ranks),
            False,
            self._stack(line, "main", None),
            ranks=ranks,
        )
        if complete:
            self.ret(op_id)
        return op_id

    def newgroup(
        self,
        ranks: list[int] | None,
        gid: str | None,
        line: int = 1,
        stack: Frames | None = None,
    ) -> RankBuilder:
        """A ``newgroup`` record: this rank called new_group (``gid`` None: not a member)."""
        self.encoder.newgroup(
            self._id(), self._time(), ranks, gid, self._stack(line, "main", stack)
        )
        return self

    def nonmember(self, api: str, line: int, stack: Frames | None = None) -> RankBuilder:
        """A ``nonmember`` record: ``api`` called on a group the rank is not in."""
        self.encoder.nonmember(self._time(), api, self._stack(line, "main", stack))
        return self

    def drop(self, op_id: int) -> RankBuilder:
        """A ``drop`` record: the work of async op ``op_id`` was dropped, never waited."""
        self.encoder.drop(op_id, self._time())
        return self

    def state(self, pending: list[int], where: str, stack: Frames = ()) -> RankBuilder:
        """A watchdog ``state`` record."""
        self.encoder.state_record(self._time(), pending, where, self._stack(0, "", stack))
        return self

    def store(
        self,
        op: str,
        line: int,
        keys: Sequence[str],
        store: str | None = "tcp:29500",
        prefix: str = "default_pg/0//",
        complete: bool = True,
        timeout: float | None = None,
        err: str | None = None,
        where: str | None = "comm",
    ) -> int:
        """A c10d Store call (``op``: get, wait, set, add, ...); one that waits for its
        keys (get, wait, multi_get) returns (``err``: it raised) unless ``complete`` is
        False, which leaves the rank inside it, followed by the watchdog's ``state``
        saying where the rank's thread is (``where``; None: no state yet).  Returns its
        id."""
        store_id = self._id()
        block = op in STORE_WAITS
        stack = self._stack(line, "main", None)
        self.encoder.store(
            store_id, self._time(), 1, op, store, prefix, keys, block, stack, timeout
        )
        if block and complete:
            self.ret(store_id, err)
        elif block and where is not None:
            self.state([], where, [(self.file, line, "main")])
        return store_id

    def threads(self, live: int) -> RankBuilder:
        """A ``threads`` record: ``live`` threads of the user's code besides the main one."""
        self.encoder.threads(self._time(), live)
        return self

    def thread_error(self, name: str, err: str, line: int, tid: int = 2) -> RankBuilder:
        """A ``thread_error`` record: thread ``name`` died of ``err`` raised at ``line``."""
        sid = self._stack(line, "worker", None)
        self.encoder.thread_error(self._time(), tid, name, err, sid)
        return self

    def end(self, how: str = "exit", err: str | None = None, line: int = 0) -> RankBuilder:
        """The end record; ``err``: the uncaught exception raised at ``line``."""
        sid = self._stack(line, "load", None) if err is not None else 0
        self.encoder.end(self._time(), how, err, sid)
        return self

    def header(self, **fields: Any) -> str:
        """The header line; ``fields`` add or replace header fields (backend, emulate)."""
        values: dict[str, Any] = {
            "rank": self.rank,
            "world_size": self.world,
            "pid": 1000 + self.rank,
            "host": "test",
            "t0": 0,
            "wall": 0,
            "dl2": "test",
        }
        values.update(fields)
        return encode.header_line(**values)

    def text(self, **header: Any) -> str:
        """The whole file: header and records."""
        return self.header(**header) + "".join(self.records)

    def trace(self, **header: Any) -> RankTrace:
        """The records so far, read back as a rank's trace (``header``: see :meth:`header`)."""
        reader = TraceReader(f"rank{self.rank}")
        records = reader.feed(self.text(**header).encode())
        assert reader.truncated is None and not reader.skipped, reader.skipped
        return reader.trace(records)


def ranks(world: int, file: str = "train.py") -> list[RankBuilder]:
    """One builder per rank of a world."""
    return [RankBuilder(r, world, file) for r in range(world)]


def two_sender_wildcards(count: int = 6) -> list[RankBuilder]:
    """Rank 0 receives ``count`` messages from any rank, ranks 1 and 2 in turn, which
    send half of them each: many matches to explore, none of which deadlocks (ended)."""
    r0, r1, r2 = ranks(3)
    for i in range(count):
        work = r0.issue("recv", 10, peer=None)
        r0.wait(work, src=1 + i % 2)
    for r in (r1, r2):
        for _ in range(count // 2):
            r.call("send", 20, peer=0)
    return [r.end() for r in (r0, r1, r2)]


#: called with every session the builders make (:func:`session`, :func:`write_run_dir`):
#: the unit tests' conftest checks the incremental model on each (``model_agreement``)
OBSERVERS: list[Callable[[Session], None]] = []


def session(builders: list[RankBuilder], states: dict[int, str] | None = None) -> Session:
    """A session from builders; ``states`` gives launcher-seen process states."""
    built = build_session([b.trace() for b in builders], states or {})
    for observe in OBSERVERS:
        observe(built)
    return built


def write_run_dir(builders: list[RankBuilder], directory: Path) -> Path:
    """Write each builder's trace as a rank's trace file in ``directory``; return it."""
    if OBSERVERS:
        session(builders)
    directory.mkdir(parents=True, exist_ok=True)
    for builder in builders:
        path = directory / trace_file_name(builder.rank, 1000 + builder.rank)
        path.write_text(builder.text())
    return directory


@dataclass(frozen=True)
class RawTrace:
    """A trace file's records as JSON objects (as ``dl2 dump`` prints them).

    Attributes:
        header: line 1.
        records: every complete record after it, with v1's field names.
        truncated: the reader's note on a partial last line, or None.
    """

    path: str
    header: dict[str, Any]
    records: tuple[dict[str, Any], ...]
    truncated: str | None

    @property
    def rank(self) -> int:
        return int(self.header["rank"])


def read_raw_trace(path: str | os.PathLike[str]) -> RawTrace:
    """A trace file's records as JSON objects (for tests of what the recorder writes),
    once the typed reader has accepted every one of them."""
    typed = read_trace_file(path)
    assert not typed.skipped and not typed.warnings, (typed.skipped, typed.warnings)
    header = json.loads(Path(path).read_bytes().split(b"\n")[0])
    records = tuple(record_to_dict(record) for record in typed.records)
    return RawTrace(str(path), header, records, typed.truncated)
