"""Build rank traces in code, record by record, for analysis unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dl2.trace.format import FORMAT_VERSION
from dl2.trace.format import MAGIC
from dl2.trace.format import RankTrace
from dl2.trace.format import encode
from dl2.trace.format import trace_file_name
from dl2.trace.session import Session
from dl2.trace.session import build_session


class RankBuilder:
    """Appends records of one rank; each op gets the user line ``file:line``."""

    def __init__(self, rank: int, world: int, file: str = "train.py") -> None:
        self.rank = rank
        self.world = world
        self.file = file
        self.records: list[dict[str, Any]] = []
        self._next_id = 0
        self._t = 0
        self._seq: dict[tuple[str, str], int] = {}

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _time(self) -> int:
        self._t += 1000
        return self._t

    def add(self, record: dict[str, Any]) -> RankBuilder:
        self.records.append(record)
        return self

    def issue(self, op: str, line: int, gid: str = "0", **fields: Any) -> int:
        """Write an op record and its ret (issued, not waited); return its id."""
        op_id = self._id()
        kind = "p2p" if op in ("send", "recv") else op
        seq_key = (gid, kind if kind == "p2p" else "coll")
        seq = self._seq.get(seq_key, 0)
        self._seq[seq_key] = seq + 1
        record: dict[str, Any] = {
            "k": "op",
            "id": op_id,
            "t": self._time(),
            "tid": 1,
            "gid": gid,
            "seq": seq,
            "op": op,
            "api": fields.pop("api", op),
            "dtype": fields.pop("dtype", None if op in ("barrier", "create_group") else "float32"),
            "count": fields.pop("count", None if op in ("barrier", "create_group") else 4),
            "stack": [[self.file, line, fields.pop("function", "main")]],
        }
        record.update(fields)
        self.records.append(record)
        self.records.append({"k": "ret", "id": op_id, "t": self._time()})
        return op_id

    def wait(self, op_id: int, complete: bool = True, src: int | None = None) -> RankBuilder:
        wait_id = self._id()
        self.records.append(
            {"k": "wait", "id": wait_id, "t": self._time(), "work": op_id, "tid": 1}
        )
        if complete:
            ret: dict[str, Any] = {"k": "ret", "id": wait_id, "t": self._time()}
            if src is not None:
                ret["src"] = src
            self.records.append(ret)
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
            {
                "k": "op",
                "id": op_id,
                "t": self._time(),
                "tid": 1,
                "gid": gid,
                "seq": None,
                "op": "create_group",
                "api": "new_group",
                "ranks": ranks,
                "stack": [[self.file, line, "main"]],
            }
        )
        if complete:
            self.records.append({"k": "ret", "id": op_id, "t": self._time()})
        return op_id

    def end(self, how: str = "exit") -> RankBuilder:
        return self.add({"k": "end", "t": self._time(), "how": how})

    def trace(self) -> RankTrace:
        header = {
            "k": "header",
            "magic": MAGIC,
            "format": FORMAT_VERSION,
            "dl2": "test",
            "rank": self.rank,
            "world_size": self.world,
            "pid": 1000 + self.rank,
            "host": "test",
            "t0": 0,
            "wall": 0,
        }
        return RankTrace(path=f"rank{self.rank}", header=header, records=tuple(self.records))


def ranks(world: int, file: str = "train.py") -> list[RankBuilder]:
    """One builder per rank of a world."""
    return [RankBuilder(r, world, file) for r in range(world)]


def session(builders: list[RankBuilder], states: dict[int, str] | None = None) -> Session:
    """A session from builders; ``states`` gives launcher-seen process states."""
    return build_session([b.trace() for b in builders], states or {})


def write_run_dir(builders: list[RankBuilder], directory: Path) -> Path:
    """Write each builder's trace as a rank's trace file in ``directory``; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    for builder in builders:
        trace = builder.trace()
        lines = [encode(trace.header), *(encode(r) for r in trace.records)]
        path = directory / trace_file_name(builder.rank, int(trace.header["pid"]))
        path.write_bytes(b"".join(lines))
    return directory
