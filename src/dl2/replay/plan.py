"""The replay plan: a recorded run's communication skeleton, ready to re-execute.

:func:`build_replay_plan` is pure: from a session (or its execution graph) it lists, per
rank, the process groups to create and the ops to issue, in recorded order, with where
each async op is waited on.  The plan holds no tensor data: the worker
(:mod:`dl2.replay.worker`) issues every op on zero-filled tensors of the recorded dtype
and element count.

Rules:

* Groups: every rank calls ``new_group`` for every recorded group (members and
  non-members alike, as torch requires), in recorded order, before its first op.
  Group creation itself is not replayed at its recorded position.
* Ops: in each rank's trace order (ops of several threads are taken in file order).
  An async op is waited on where its first ``wait`` is (:func:`dl2.model.program.
  wait_position`); one never waited on is not.  Blocking ops block.  Ops that raised in
  the recorded run are left out (``notes`` says so).  The ops of one
  ``batch_isend_irecv`` are issued by one ``batch_isend_irecv`` again.
* Wildcard receives (``recv(src=None)``) are forced: to the witness's choice when one
  is given, else to the sender they matched in the recorded run; one that never
  matched and has no choice stays a wildcard.
* Each op keeps its recorded user stack, so the worker can issue it from its original
  ``file:line`` (see the worker).

The plan is JSON-serialisable (:meth:`ReplayPlan.to_json` / :func:`plan_from_json`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any

from dl2.documents import check_document
from dl2.errors import ConfigError
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import build_execution_graph
from dl2.model.ops import Op
from dl2.model.ops import Timeline
from dl2.model.program import wait_position
from dl2.model.program import world_ranks
from dl2.trace.schema.decode import NewGroupRecord
from dl2.trace.session import Session

if TYPE_CHECKING:  # the worker imports this module: keep the analysis out of its start-up
    from dl2.analysis.prediction.witness import Witness

__all__ = [
    "PLAN_FORMAT",
    "SUPPORTED_OPS",
    "ForcedChoice",
    "PlanGroup",
    "PlanOp",
    "RankPlan",
    "ReplayPlan",
    "build_replay_plan",
    "plan_from_json",
]

#: Version of the plan JSON document.
PLAN_FORMAT = 1

#: Ops the worker can issue.
SUPPORTED_OPS = frozenset(
    {
        "send",
        "recv",
        "all_reduce",
        "all_reduce_coalesced",
        "broadcast",
        "reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_coalesced",
        "all_gather_into_tensor_coalesced",
        "gather",
        "scatter",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "monitored_barrier",
    }
)

Frame = tuple[str, int, str]  # (file, line, function)


@dataclass(frozen=True)
class PlanGroup:
    """A process group to create: its recorded name and global ranks (None: the world)."""

    gid: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class PlanOp:
    """One op to issue.

    Attributes:
        id: the op's id in the recorded trace.
        op: the recorded op name; ``api`` the torch.distributed function called.
        gid: the recorded group name (see :attr:`ReplayPlan.groups`).
        peer: P2P: the global peer rank (a wildcard recv's forced sender), None for a
            wildcard that stays one.
        root, tag, redop, dtype, count, splits: as recorded (see the trace format).
        is_async: issued async (waited on at a ``("wait", i)`` step, if any).
        batch: ops of one batch_isend_irecv share it.
        stack: the recorded user frames, innermost first.
        forced: for a wildcard recv given a sender: "witness" or "recorded".
    """

    id: int
    op: str
    gid: str
    api: str | None = None
    peer: int | None = None
    root: int | None = None
    tag: int = 0
    redop: str | None = None
    dtype: str = "float32"
    count: int = 0
    splits: tuple[tuple[int, ...], ...] | None = None
    is_async: bool = False
    batch: int | None = None
    stack: tuple[Frame, ...] = ()
    forced: str | None = None

    @property
    def location(self) -> str:
        if not self.stack:
            return "?"
        file, line, _ = self.stack[0]
        return f"{file.rsplit('/', 1)[-1]}:{line}"


@dataclass(frozen=True)
class RankPlan:
    """One rank's program: ``steps`` are ("op", i) to issue ``ops[i]`` and ("wait", i)
    to wait on it."""

    rank: int
    ops: tuple[PlanOp, ...]
    steps: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class ForcedChoice:
    """A wildcard receive forced to a sender.

    Attributes:
        rank, op_id: the receive; ``location`` its source line.
        sender: the sender it is forced to; ``recorded`` the one it matched when recorded.
        source: "witness" (the witness's choice) or "recorded".
    """

    rank: int
    op_id: int
    sender: int
    recorded: int | None
    source: str
    location: str


@dataclass(frozen=True)
class ReplayPlan:
    """Everything the worker needs, for every rank.

    Attributes:
        world_size: ranks to start.
        groups: the groups every rank creates, in recorded order (the default group
            excluded).
        default_gid: the recorded name of the default group.
        ranks: each rank's program, by rank.
        choices: the wildcard receives it forces.
        notes: what the replay leaves out or cannot follow.
    """

    world_size: int
    groups: tuple[PlanGroup, ...]
    ranks: tuple[RankPlan, ...]
    default_gid: str = "0"
    choices: tuple[ForcedChoice, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def op_count(self) -> int:
        return sum(len(r.ops) for r in self.ranks)

    def rank_plan(self, rank: int) -> RankPlan:
        for plan in self.ranks:
            if plan.rank == rank:
                return plan
        return RankPlan(rank, (), ())

    def to_json(self) -> dict[str, Any]:
        """A JSON-compatible document (see :func:`plan_from_json`)."""
        return {
            "format": PLAN_FORMAT,
            "kind": "dl2-replay-plan",
            "world_size": self.world_size,
            "default_gid": self.default_gid,
            "groups": [{"gid": g.gid, "ranks": list(g.ranks)} for g in self.groups],
            "ranks": [
                {
                    "rank": r.rank,
                    "steps": [[kind, i] for kind, i in r.steps],
                    "ops": [_op_to_json(op) for op in r.ops],
                }
                for r in self.ranks
            ],
            "choices": [
                {
                    "rank": c.rank,
                    "op": c.op_id,
                    "sender": c.sender,
                    "recorded": c.recorded,
                    "source": c.source,
                    "location": c.location,
                }
                for c in self.choices
            ],
            "notes": list(self.notes),
        }


def _op_to_json(op: PlanOp) -> dict[str, Any]:
    return {
        "id": op.id,
        "op": op.op,
        "gid": op.gid,
        "api": op.api,
        "peer": op.peer,
        "root": op.root,
        "tag": op.tag,
        "redop": op.redop,
        "dtype": op.dtype,
        "count": op.count,
        "splits": [list(s) for s in op.splits] if op.splits is not None else None,
        "async": op.is_async,
        "batch": op.batch,
        "stack": [list(f) for f in op.stack],
        "forced": op.forced,
    }


def _op_from_json(data: Mapping[str, Any]) -> PlanOp:
    splits = data.get("splits")
    return PlanOp(
        id=int(data["id"]),
        op=str(data["op"]),
        gid=str(data["gid"]),
        api=data.get("api"),
        peer=data.get("peer"),
        root=data.get("root"),
        tag=int(data.get("tag") or 0),
        redop=data.get("redop"),
        dtype=str(data.get("dtype") or "float32"),
        count=int(data.get("count") or 0),
        splits=tuple(tuple(int(x) for x in s) for s in splits) if splits is not None else None,
        is_async=bool(data.get("async")),
        batch=data.get("batch"),
        stack=tuple((str(f[0]), int(f[1]), str(f[2])) for f in data.get("stack", [])),
        forced=data.get("forced"),
    )


def plan_from_json(data: Any) -> ReplayPlan:
    """Read back :meth:`ReplayPlan.to_json`'s document.

    Raises:
        ConfigError: not a replay plan, or of another format version.
    """
    data = check_document(data, "dl2-replay-plan", PLAN_FORMAT, "replay plan")
    try:
        return ReplayPlan(
            world_size=int(data["world_size"]),
            default_gid=str(data.get("default_gid", "0")),
            groups=tuple(
                PlanGroup(str(g["gid"]), tuple(int(r) for r in g["ranks"])) for g in data["groups"]
            ),
            ranks=tuple(
                RankPlan(
                    rank=int(r["rank"]),
                    ops=tuple(_op_from_json(op) for op in r["ops"]),
                    steps=tuple((str(kind), int(i)) for kind, i in r["steps"]),
                )
                for r in data["ranks"]
            ),
            choices=tuple(
                ForcedChoice(
                    rank=int(c["rank"]),
                    op_id=int(c["op"]),
                    sender=int(c["sender"]),
                    recorded=c.get("recorded"),
                    source=str(c["source"]),
                    location=str(c.get("location", "?")),
                )
                for c in data.get("choices", [])
            ),
            notes=tuple(str(n) for n in data.get("notes", [])),
        )
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ConfigError(f"not a dl2 replay plan: {err}") from None


# -- building ---------------------------------------------------------------------------


Choices = Mapping[tuple[int, int], int]  # (rank, recv op id) -> sender rank


def _choices_of(choices: Witness | Choices | None) -> dict[tuple[int, int], int]:
    if choices is None:
        return {}
    if not isinstance(choices, Mapping):  # a Witness
        return {(c.rank, c.op_id): c.sender for c in choices.choices}
    return {(int(r), int(i)): int(s) for (r, i), s in choices.items()}


def _default_gid(graph: ExecutionGraph) -> str:
    """The recorded name of the default group (created by init_process_group)."""
    for timeline in graph.timelines.values():
        for op in timeline.ops:
            if op.op == "create_group" and op.api == "init_process_group":
                return op.gid
    return "0"


def _groups(graph: ExecutionGraph, default_gid: str) -> tuple[PlanGroup, ...]:
    """The groups every rank creates, in recorded order.

    From the ``newgroup`` records (every caller of new_group writes one, members and
    non-members alike): the longest rank's sequence, each entry named by a member's
    record.  Without such records (traces built in tests), from the ``create_group``
    ops, in the order of their first appearance.
    """
    sequences: dict[int, list[NewGroupRecord]] = {
        rank: list(t.newgroups) for rank, t in graph.timelines.items()
    }
    longest = max(sequences.values(), key=len, default=[])
    groups: list[PlanGroup] = []
    seen: set[str] = {default_gid}
    if longest:
        for index, record in enumerate(longest):
            ranks = record.ranks
            gid = next(
                (
                    str(seq[index].gid)
                    for seq in sequences.values()
                    if index < len(seq) and seq[index].gid is not None
                ),
                None,
            )
            if gid is None or gid in seen:
                gid = f"unnamed-{index}" if gid is None else gid
            members = (
                tuple(int(r) for r in ranks)
                if ranks is not None
                else tuple(range(graph.world_size))
            )
            seen.add(gid)
            groups.append(PlanGroup(gid, members))
    for rank in sorted(graph.timelines):
        for op in graph.timelines[rank].ops:
            if op.op == "create_group" and op.gid not in seen and op.ranks is not None:
                seen.add(op.gid)
                groups.append(PlanGroup(op.gid, tuple(op.ranks)))
    return tuple(groups)


def _rank_plan(
    timeline: Timeline,
    choices: Mapping[tuple[int, int], int],
    forced: list[ForcedChoice],
    notes: list[str],
    known_groups: set[str],
) -> RankPlan:
    ops: list[PlanOp] = []
    index_of: dict[int, int] = {}  # recorded op index -> plan op index
    waits: dict[int, list[int]] = {}  # recorded position -> plan ops waited there
    skipped: list[str] = []
    for op in timeline.ops:
        if op.op == "create_group":
            continue
        if op.error is not None:
            skipped.append(f"op {op.id} ({op.op}, raised when recorded)")
            continue
        if op.op not in SUPPORTED_OPS:
            raise ConfigError(
                f"rank {timeline.rank}: op {op.id} ({op.op}) cannot be replayed; "
                f"replayable ops: {', '.join(sorted(SUPPORTED_OPS))}"
            )
        if op.gid not in known_groups:
            raise ConfigError(
                f"rank {timeline.rank}: op {op.id} uses group {op.gid}, which no trace creates"
            )
        index_of[op.index] = len(ops)
        ops.append(_plan_op(op, choices, forced))
        if op.is_async and (at := wait_position(op)) is not None:
            waits.setdefault(at, []).append(len(ops) - 1)
    if skipped:
        notes.append(f"rank {timeline.rank}: left out {', '.join(skipped)}")
    steps: list[tuple[str, int]] = []
    for op in timeline.ops:
        steps.extend(("wait", i) for i in waits.pop(op.index, ()))
        if op.index in index_of:
            steps.append(("op", index_of[op.index]))
    for position in sorted(waits):
        steps.extend(("wait", i) for i in waits[position])
    return RankPlan(timeline.rank, tuple(ops), tuple(steps))


def _plan_op(op: Op, choices: Mapping[tuple[int, int], int], forced: list[ForcedChoice]) -> PlanOp:
    peer = op.peer if op.op in ("send", "recv") else None
    how: str | None = None
    if op.op == "recv" and op.peer is None:
        chosen = choices.get((op.rank, op.id))
        if chosen is not None:
            peer, how = chosen, "witness"
        elif op.src is not None:
            peer, how = op.src, "recorded"
        frame = op.frame
        location = f"{frame.file.rsplit('/', 1)[-1]}:{frame.line}" if frame else "?"
        if peer is not None and how is not None:
            forced.append(ForcedChoice(op.rank, op.id, peer, op.src, how, location))
    return PlanOp(
        id=op.id,
        op=op.op,
        gid=op.gid,
        api=op.api,
        peer=peer,
        root=op.root,
        tag=op.tag or 0,
        redop=op.redop,
        dtype=op.dtype or "float32",
        count=op.count or 0,
        splits=op.splits,
        is_async=op.is_async,
        batch=op.batch,
        stack=tuple((f.file, f.line, f.function) for f in op.stack),
        forced=how,
    )


def build_replay_plan(
    session_or_graph: Session | ExecutionGraph,
    choices: Witness | Choices | None = None,
) -> ReplayPlan:
    """The replay plan of a recorded run (see the module docstring).

    Args:
        session_or_graph: the recorded run.
        choices: a witness (its wildcard matches are forced) or a mapping
            (rank, recv op id) -> sender rank; None: recorded matches.

    Raises:
        ConfigError: an op the worker cannot issue, a group no trace creates, or a
            choice that names no wildcard receive of the run.
    """
    graph = (
        session_or_graph
        if isinstance(session_or_graph, ExecutionGraph)
        else build_execution_graph(session_or_graph)
    )
    wanted = _choices_of(choices)
    default_gid = _default_gid(graph)
    groups = _groups(graph, default_gid)
    known = {default_gid, *(g.gid for g in groups)}
    forced: list[ForcedChoice] = []
    notes: list[str] = []
    ranks = tuple(
        _rank_plan(graph.timelines[rank], wanted, forced, notes, known)
        for rank in sorted(graph.timelines)
    )
    unknown = sorted(set(wanted) - {(c.rank, c.op_id) for c in forced if c.source == "witness"})
    if unknown:
        rank, op_id = unknown[0]
        raise ConfigError(
            f"the choices name rank {rank}'s op {op_id}, which is no wildcard receive of "
            "this run: is the witness from another run?"
        )
    world = world_ranks(graph.world_size, graph.timelines)
    missing = [r for r in world if r not in graph.timelines]
    if missing:
        notes.append(f"no trace from rank(s) {', '.join(map(str, missing))}: they issue nothing")
    return ReplayPlan(
        world_size=len(world),
        groups=groups,
        ranks=ranks,
        default_gid=default_gid,
        choices=tuple(forced),
        notes=tuple(notes),
    )
