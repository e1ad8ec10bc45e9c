"""Flight Recorder dumps built field for field as PyTorch writes them.

Modelled on ``FlightRecorderDetail.hpp`` (``getCollectiveTrace``, ``dump_json``,
``getPgConfig``, ``getPgStatus``) and ``ProcessGroupNCCL``'s use of it: every launch
records an entry with the group's ``collective_seq_id`` (bumped per collective launch,
a coalesced group counting once), ``p2p_seq_id`` (bumped per P2P launch) and ``op_id``
(bumped per op); P2P profiling names carry group-local ranks (``nccl:send 0->1``); the
ops of a coalesced group share their sequence id and are followed by a
``nccl:coalesced`` entry whose events give the group's state.  The pickle form holds
tuples for ``process_group`` and None for unseen times; the JSON form lists and 0, no
frames, and ``pg_status`` values as strings.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

SCRIPT = "/job/train.py"
TORCH_C10D = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"


@dataclass
class _Group:
    name: str
    desc: str
    ranks: list[int]
    pg_id: int
    collective_seq: int = 0
    p2p_seq: int = 0
    op_id: int = 0
    last_completed: int = -1
    last_started: int = -1


@dataclass
class RankDump:
    """One rank's recorder: call the ops in program order, then :meth:`dump`."""

    rank: int
    version: str = "2.10"
    backend: str = "nccl"
    groups: dict[str, _Group] = field(default_factory=dict)
    entries: list[dict[str, Any]] = field(default_factory=list)
    record_id: int = 0
    time_ns: int = 1_700_000_000_000_000_000

    def group(self, name: str, ranks: list[int], desc: str = "undefined") -> RankDump:
        self.groups[name] = _Group(name, desc, ranks, len(self.groups))
        return self

    def _entry(
        self,
        g: _Group,
        name: str,
        sizes: list[list[int]],
        dtype: str,
        line: int,
        state: str,
        is_p2p: bool,
    ) -> dict[str, Any]:
        self.time_ns += 1000
        started = self.time_ns + 10 if state in ("started", "completed") else None
        completed = self.time_ns + 20 if state == "completed" else None
        entry = {
            "record_id": self.record_id,
            "pg_id": g.pg_id,
            "process_group": (g.name, g.desc),
            "thread_name": "pt_main_thread",
            "thread_id": "140000000000",
            "collective_seq_id": g.collective_seq,
            "p2p_seq_id": g.p2p_seq,
            "op_id": g.op_id,
            "profiling_name": f"{self.backend}:{name}",
            "time_created_ns": self.time_ns,
            "input_sizes": sizes,
            "input_dtypes": [dtype] * len(sizes),
            "output_sizes": sizes,
            "output_dtypes": [dtype] * len(sizes),
            "state": state,
            "time_discovered_started_ns": started,
            "time_discovered_completed_ns": completed,
            "retired": state == "completed",
            "timeout_ms": 600000,
            "is_p2p": is_p2p,
            "frames": [
                {"name": name.split()[0], "filename": TORCH_C10D, "line": 2800},
                {"name": "step", "filename": SCRIPT, "line": line},
                {"name": "<module>", "filename": SCRIPT, "line": 99},
            ],
        }
        self.record_id += 1
        return entry

    def collective(
        self,
        group: str,
        name: str,
        line: int,
        numel: int = 4,
        dtype: str = "Float",
        state: str = "completed",
    ) -> RankDump:
        g = self.groups[group]
        g.collective_seq += 1
        g.op_id += 1
        self.entries.append(self._entry(g, name, [[numel]], dtype, line, state, False))
        self._status(g, state, g.collective_seq)
        return self

    def p2p(
        self,
        group: str,
        kind: str,
        peer_local: int,
        line: int,
        numel: int = 4,
        state: str = "completed",
    ) -> RankDump:
        g = self.groups[group]
        me = g.ranks.index(self.rank)
        g.p2p_seq += 1
        g.op_id += 1
        arrow = f"{me}->{peer_local}" if kind == "send" else f"{me}<-{peer_local}"
        self.entries.append(
            self._entry(g, f"{kind} {arrow}", [[numel]], "Float", line, state, True)
        )
        return self

    def batch(
        self, group: str, ops: list[tuple[str, int]], line: int, state: str = "completed"
    ) -> RankDump:
        """batch_isend_irecv: one P2P launch of several ops (events on the closing entry)."""
        g = self.groups[group]
        me = g.ranks.index(self.rank)
        g.p2p_seq += 1
        for kind, peer in ops:
            g.op_id += 1
            arrow = f"{me}->{peer}" if kind == "send" else f"{me}<-{peer}"
            self.entries.append(
                self._entry(g, f"{kind} {arrow}", [[4]], "Float", line, "scheduled", True)
            )
        closer = self._entry(g, "coalesced", [], "Float", line, state, True)
        self.entries.append(closer)
        return self

    def _status(self, g: _Group, state: str, seq: int) -> None:
        if state in ("started", "completed"):
            g.last_started = seq
        if state == "completed":
            g.last_completed = seq

    def as_dict(self, keep_last: int | None = None, frames: bool = True) -> dict[str, Any]:
        entries = self.entries if keep_last is None else self.entries[-keep_last:]
        if not frames:
            entries = [{k: v for k, v in e.items() if k != "frames"} for e in entries]
        return {
            "version": self.version,
            _lib_key(self.version): "2.21.5",
            "pg_config": {
                g.name: {"name": g.name, "desc": g.desc, "ranks": str(g.ranks)}
                for g in self.groups.values()
            },
            "pg_status": {
                str(g.pg_id): {
                    "last_enqueued_collective": g.collective_seq,
                    "last_started_collective": g.last_started,
                    "last_completed_collective": g.last_completed,
                }
                for g in self.groups.values()
            },
            "entries": entries,
        }

    def write_pickle(self, directory: Path, prefix: str = "nccl_trace_rank_", **kw: Any) -> Path:
        path = directory / f"{prefix}{self.rank}"
        path.write_bytes(pickle.dumps(self.as_dict(**kw)))
        return path

    def write_json(self, directory: Path, prefix: str = "comm_lib_trace_rank_", **kw: Any) -> Path:
        data = self.as_dict(frames=False, **kw)
        for e in data["entries"]:
            e["process_group"] = list(e["process_group"])
            for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
                e[key] = e[key] or 0
        data["pg_status"] = {
            k: {kk: str(vv) for kk, vv in v.items()} for k, v in data["pg_status"].items()
        }
        path = directory / f"{prefix}{self.rank}"
        path.write_text(json.dumps(data))
        return path


def _lib_key(version: str) -> str:
    """``comm_lib_version`` from schema 2.9 on, ``nccl_version`` before."""
    major, minor = (int(p) for p in version.split("."))
    return "comm_lib_version" if (major, minor) >= (2, 9) else "nccl_version"


def world(n: int, version: str = "2.10", backend: str = "nccl") -> list[RankDump]:
    """n ranks with the default group "0" of every rank."""
    return [
        RankDump(r, version, backend).group("0", list(range(n)), "default_pg") for r in range(n)
    ]
