"""Build rank traces in code, record by record, for analysis unit tests.

Records are written with the recorder's own encoders (:mod:`dl2.trace.schema.encode`)
and read back by the trace reader, so a built trace is one a rank could have written.
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
from dl2.trace.format import parse_header
from dl2.trace.format import parse_records
from dl2.trace.format import read_trace_file
from dl2.trace.format import trace_file_name
from dl2.trace.schema import STORE_WAITS
from dl2.trace.schema import encode
from dl2.trace.session import Session
from dl2.trace.session import build_session

#: A stack as tests write it: ``[file, line, function]`` frames, innermost first.
Frames = Sequence[Sequence[Any]]


class RankBuilder:
    """Appends records of one rank; each op gets the user line ``file:line``.

    Attributes:
        records: the encoded record lines so far (a test may drop the last one).
    """

    def __init__(self, rank: int, world: int, file: str = "train.py") -> None:
        self.rank = rank
        self.world = world
        self.file = file
        self.records: list[str] = []
        self._next_id = 0
        self._t = 0
        self._seq: dict[tuple[str, str], int] = {}

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _time(self) -> int:
        self._t += 1000
        return self._t

    def _stack(self, line: int, function: str, stack: Frames | None) -> str:
        """``stack`` encoded, or by default the one frame ``file:line`` in ``function``."""
        frames = [(self.file, line, function)] if stack is None else stack
        return encode.stack_of((str(f[0]), int(f[1]), str(f[2])) for f in frames)

    def issue(
        self, op: str, line: int, gid: str = "0", returned: bool = True, **fields: Any
    ) -> int:
        """Write an op record and its ret (issued, not waited); return its id.

        ``fields`` are the op record's own (peer, root, tag, redop, dtype, count,
        splits, ranks, timeout, async, batch, eager, deferred, api), plus ``function``
        or a whole ``stack``.  ``returned=False`` leaves the rank inside the call.
        """
        op_id = self._id()
        kind = "p2p" if op in ("send", "recv") else op
        seq_key = (gid, kind if kind == "p2p" else "coll")
        seq = self._seq.get(seq_key, 0)
        self._seq[seq_key] = seq + 1
        api = fields.pop("api", op)
        stack = self._stack(line, fields.pop("function", "main"), fields.pop("stack", None))
        is_async = bool(fields.pop("async", False))
        after = encode.after_fields(
            fields.pop("batch", None), fields.pop("eager", False), fields.pop("deferred", False)
        )
        no_data = op in ("barrier", "create_group")
        fields.setdefault("dtype", None if no_data else "float32")
        fields.setdefault("count", None if no_data else 4)
        own = encode.op_fields(**fields)
        gid_json, t = encode.json_str(gid), self._time()
        self.records.append(
            encode.op_line(op_id, t, 1, gid_json, seq, op, api, own, is_async, stack, after)
        )
        if returned:
            self.ret(op_id)
        return op_id

    def ret(self, record_id: int, err: str | None = None, src: int | None = None) -> RankBuilder:
        """The ``ret`` of an op or wait (``err``: it raised)."""
        self.records.append(encode.ret_line(record_id, self._time(), err, src))
        return self

    def wait(
        self,
        op_id: int,
        complete: bool = True,
        src: int | None = None,
        err: str | None = None,
    ) -> RankBuilder:
        """A wait on ``op_id``: returned (``src``: a wildcard's sender; ``err``: it raised)
        or, with ``complete=False``, still waiting."""
        wait_id = self._id()
        self.records.append(encode.wait_line(wait_id, self._time(), 1, op_id, encode.EMPTY_STACK))
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

    def create_group(self, gid: str, ranks: list[int], line: int = 1, complete: bool = True) -> int:
        op_id = self._id()
        self.records.append(
            encode.op_line(
                op_id,
                self._time(),
                1,
                encode.json_str(gid),
                None,
                "create_group",
                "new_group",
                encode.ranks_field(ranks),
                False,
                self._stack(line, "main", None),
            )
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
        self.records.append(
            encode.newgroup_line(
                self._id(), self._time(), ranks, gid, self._stack(line, "main", stack)
            )
        )
        return self

    def nonmember(self, api: str, line: int, stack: Frames | None = None) -> RankBuilder:
        """A ``nonmember`` record: ``api`` called on a group the rank is not in."""
        self.records.append(
            encode.nonmember_line(self._time(), api, self._stack(line, "main", stack))
        )
        return self

    def drop(self, op_id: int) -> RankBuilder:
        """A ``drop`` record: the work of async op ``op_id`` was dropped, never waited."""
        self.records.append(encode.drop_line(op_id, self._time()))
        return self

    def state(self, pending: list[int], where: str, stack: Frames = ()) -> RankBuilder:
        """A watchdog ``state`` record."""
        self.records.append(
            encode.state_line(self._time(), pending, where, self._stack(0, "", stack))
        )
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
        self.records.append(
            encode.store_line(
                store_id, self._time(), 1, op, store, prefix, keys, block, stack, timeout
            )
        )
        if block and complete:
            self.ret(store_id, err)
        elif block and where is not None:
            self.state([], where, [(self.file, line, "main")])
        return store_id

    def end(self, how: str = "exit") -> RankBuilder:
        self.records.append(encode.end_line(self._time(), how))
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

    def trace(self, **header: Any) -> RankTrace:
        """The records so far, read back as a rank's trace (``header``: see :meth:`header`)."""
        path = f"rank{self.rank}"
        parsed = parse_records("".join(self.records).encode(), path, 2)
        assert parsed.truncated is None and not parsed.skipped, parsed
        first = parse_header(self.header(**header).rstrip("\n").encode(), path)
        return RankTrace(path=path, header=first, records=tuple(parsed.records))


def ranks(world: int, file: str = "train.py") -> list[RankBuilder]:
    """One builder per rank of a world."""
    return [RankBuilder(r, world, file) for r in range(world)]


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
        path.write_text(builder.header() + "".join(builder.records))
    return directory


@dataclass(frozen=True)
class RawTrace:
    """A trace file's lines as the recorder wrote them, as JSON objects.

    Attributes:
        header: line 1.
        records: every complete record line after it.
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
    """A trace file's records as written (for tests of what the recorder writes), once
    the typed reader has accepted every one of them."""
    typed = read_trace_file(path)
    lines = Path(path).read_bytes().split(b"\n")
    records = tuple(json.loads(line) for line in lines[1 : 1 + len(typed.records)])
    return RawTrace(str(path), json.loads(lines[0]), records, typed.truncated)
