"""Operations and per-rank timelines rebuilt from trace records (no I/O, no matching)."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Any

from dl2.model.stuck import stall_kind
from dl2.trace.format import RankTrace

#: Collectives whose per-rank input element count must agree across members.
SAME_COUNT_OPS = frozenset(
    {
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_reduce_coalesced",
    }
)
P2P_OPS = frozenset({"send", "recv"})
GROUP_OPS = frozenset({"create_group"})
#: Ops that carry no tensor, so dtype and count are not compared.
NO_DATA_OPS = frozenset({"barrier", "monitored_barrier"})


def is_installed_file(file: str) -> bool:
    """A file of an installed package (site-packages), not of the user's own code."""
    return "site-packages" in file or "dist-packages" in file


@dataclass(frozen=True)
class Frame:
    """A user source location."""

    file: str
    line: int
    function: str


@dataclass(frozen=True)
class Op:
    """One communication call of one rank, with what the trace says of its fate.

    ``issued`` means the call returned (for P2P and collectives: the work exists);
    ``completed`` means a wait on it returned or the watchdog saw it done.
    """

    rank: int
    id: int
    op: str
    gid: str
    index: int  # position in the rank's file order of ops (program order)
    seq: int | None = None
    api: str | None = None
    peer: int | None = None
    root: int | None = None
    tag: int | None = None
    redop: str | None = None
    dtype: str | None = None
    count: int | None = None
    splits: tuple[tuple[int, ...], ...] | None = None
    ranks: tuple[int, ...] | None = None
    #: monitored_barrier: its timeout (s), past which it raises instead of waiting on
    timeout: float | None = None
    is_async: bool = False
    batch: int | None = None  # ops of one batch_isend_irecv / coalescing block share it
    stack: tuple[Frame, ...] = ()
    issued: bool = False
    completed: bool = False
    error: str | None = None
    src: int | None = None  # matched sender of a completed wildcard recv
    #: where the rank first waited on it: the number of its ops issued before that
    #: ``wait`` record (so at least ``index + 1``); None if the trace has no wait on it
    waited_at: int | None = None
    #: an eager send (``dl2 run --buffer-size``): complete for its rank once issued,
    #: whether or not the peer has received it yet
    eager: bool = False
    #: a P2P op of a batch under fused-batch emulation: issued only when its whole
    #: batch can launch (until its ``ret``, its rank sits in the batch call)
    deferred: bool = False

    @property
    def kind(self) -> str:
        """ "p2p", "group" or "collective"."""
        if self.op in P2P_OPS:
            return "p2p"
        if self.op in GROUP_OPS:
            return "group"
        return "collective"

    @property
    def frame(self) -> Frame | None:
        """The line to name: the innermost frame of the user's own code, skipping
        installed packages (a collective issued inside transformers names the script
        line that called the model); the innermost frame when all are packages'."""
        for frame in self.stack:
            if not is_installed_file(frame.file):
                return frame
        return self.stack[0] if self.stack else None

    @property
    def signature(self) -> str:
        """Short human signature: ``float32[1024] sum root=0``."""
        parts: list[str] = []
        if self.dtype is not None:
            parts.append(f"{self.dtype}[{self.count if self.count is not None else '?'}]")
        if self.redop:
            parts.append(self.redop)
        if self.root is not None:
            parts.append(f"root={self.root}")
        if self.tag:
            parts.append(f"tag={self.tag}")
        return " ".join(parts)


@dataclass(frozen=True)
class Blocked:
    """What a rank is stuck in at the end of its trace.

    Attributes:
        ops: the ops it needs to complete (one for a wait or an open call; several
            for a watchdog-reported stall on pending async works).
        how: "wait" (in Work.wait), "call" (inside the call itself), "stall"
            (the watchdog saw the main thread inside backward/communication) or "poll"
            (the watchdog saw it spin polling ``is_completed()`` on these works).
    """

    ops: tuple[Op, ...]
    how: str


@dataclass(frozen=True)
class Timeline:
    """One rank's ops in program order and its final blocking state."""

    rank: int
    ops: tuple[Op, ...]
    blocked: Blocked | None
    ended: str | None  # "exit" or "destroy" from an end record
    newgroups: tuple[dict[str, Any], ...] = ()
    nonmember_calls: tuple[dict[str, Any], ...] = ()
    last_state: dict[str, Any] | None = None
    record_count: int = 0
    truncated: bool = False
    by_id: dict[int, Op] = field(default_factory=dict, compare=False, repr=False)


def _frames(raw: Any) -> tuple[Frame, ...]:
    frames: list[Frame] = []
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, list | tuple) and len(item) >= 2:
                func = str(item[2]) if len(item) > 2 else "?"
                frames.append(Frame(str(item[0]), int(item[1]), func))
    return tuple(frames)


def _opt_float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _splits(raw: Any) -> tuple[tuple[int, ...], ...] | None:
    if not isinstance(raw, list):
        return None
    return tuple(tuple(int(x) for x in part) for part in raw if isinstance(part, list))


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def build_timeline(trace: RankTrace) -> Timeline:
    """Rebuild one rank's ops and final state from its records."""
    rank = trace.rank
    fields: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    waits: dict[int, int] = {}  # wait id -> op id
    open_calls: list[int] = []  # op or wait ids entered and not returned, in order
    newgroups: list[dict[str, Any]] = []
    nonmember: list[dict[str, Any]] = []
    ended: str | None = None
    last_state: dict[str, Any] | None = None
    last_state_pos = -1
    last_activity_pos = -1
    for pos, rec in enumerate(trace.records):
        kind = rec.get("k")
        if kind == "op" and isinstance(rec.get("id"), int):
            fields[rec["id"]] = {"rec": rec, "issued": False, "completed": False}
            order.append(rec["id"])
            open_calls.append(rec["id"])
            last_activity_pos = pos
        elif kind == "wait" and isinstance(rec.get("id"), int):
            waits[rec["id"]] = int(rec.get("work", -1))
            target = fields.get(waits[rec["id"]])
            if target is not None and "waited_at" not in target:
                target["waited_at"] = len(order)
            open_calls.append(rec["id"])
            last_activity_pos = pos
        elif kind == "ret" and isinstance(rec.get("id"), int):
            rid = rec["id"]
            if rid in open_calls:
                open_calls.remove(rid)
            if rid in waits:
                target = fields.get(waits[rid])
                if target is not None and rec.get("err"):
                    target["error"] = str(rec["err"])
                elif target is not None:
                    target["completed"] = True
                    if rec.get("src") is not None:
                        target["src"] = rec["src"]
            elif rid in fields:
                fields[rid]["issued"] = True
                if rec.get("err"):
                    fields[rid]["error"] = str(rec["err"])
                elif fields[rid]["rec"].get("eager"):
                    fields[rid]["completed"] = True  # an eager send completes on issue
                elif not fields[rid]["rec"].get("async") and fields[rid]["rec"].get("op") in (
                    "create_group",
                    "monitored_barrier",
                ):
                    fields[rid]["completed"] = True
            last_activity_pos = pos
        elif kind == "done" and isinstance(rec.get("id"), int) and rec["id"] in fields:
            fields[rec["id"]]["completed"] = True
            if rec.get("src") is not None:
                fields[rec["id"]]["src"] = rec["src"]
        elif kind == "newgroup":
            newgroups.append(rec)
        elif kind == "nonmember":
            nonmember.append(rec)
        elif kind == "state":
            last_state, last_state_pos = rec, pos
        elif kind == "end":
            ended = str(rec.get("how", "exit"))

    ops: list[Op] = []
    by_id: dict[int, Op] = {}
    for index, op_id in enumerate(order):
        info = fields[op_id]
        rec = info["rec"]
        ranks = rec.get("ranks")
        op = Op(
            rank=rank,
            id=op_id,
            op=str(rec.get("op", "?")),
            gid=str(rec.get("gid", "0")),
            index=index,
            seq=_opt_int(rec.get("seq")),
            api=rec.get("api"),
            peer=_opt_int(rec.get("peer")),
            root=_opt_int(rec.get("root")),
            tag=_opt_int(rec.get("tag")),
            redop=rec.get("redop"),
            dtype=rec.get("dtype"),
            count=_opt_int(rec.get("count")),
            splits=_splits(rec.get("splits")),
            ranks=tuple(int(r) for r in ranks) if isinstance(ranks, list) else None,
            timeout=_opt_float(rec.get("timeout")),
            is_async=bool(rec.get("async")),
            batch=_opt_int(rec.get("batch")),
            stack=_frames(rec.get("stack")),
            issued=info["issued"],
            completed=info["completed"],
            error=info.get("error"),
            src=_opt_int(info.get("src")),
            waited_at=info.get("waited_at"),
            eager=bool(rec.get("eager")),
            deferred=bool(rec.get("deferred")),
        )
        ops.append(op)
        by_id[op_id] = op

    blocked = _final_block(open_calls, waits, by_id, last_state, last_state_pos, last_activity_pos)
    return Timeline(
        rank=rank,
        ops=tuple(ops),
        blocked=blocked if ended is None else None,
        ended=ended,
        newgroups=tuple(newgroups),
        nonmember_calls=tuple(nonmember),
        last_state=last_state,
        record_count=len(trace.records),
        truncated=trace.truncated is not None,
        by_id=by_id,
    )


def _final_block(
    open_calls: list[int],
    waits: dict[int, int],
    by_id: dict[int, Op],
    last_state: dict[str, Any] | None,
    last_state_pos: int,
    last_activity_pos: int,
) -> Blocked | None:
    """The innermost open call decides; else a fresh watchdog stall report."""
    if open_calls:
        last = open_calls[-1]
        if last in waits:
            target = by_id.get(waits[last])
            return Blocked((target,), "wait") if target is not None else None
        op = by_id.get(last)
        if op is not None and op.deferred and op.batch is not None:
            # Inside a fused batch waiting for its launch: it needs every op of the batch.
            batch = tuple(
                o
                for i in open_calls
                if (o := by_id.get(i)) is not None and o.deferred and o.batch == op.batch
            )
            return Blocked(batch, "call")
        if op is not None:
            return Blocked((op,), "call")
    if last_state is None or last_state_pos <= last_activity_pos:
        return None
    how = stall_kind(last_state.get("where"), last_state.get("pending"))
    if how is None:
        return None
    pending = [
        by_id[i]
        for i in last_state["pending"]
        if isinstance(i, int) and i in by_id and not by_id[i].completed
    ]
    return Blocked(tuple(pending), how) if pending else None
