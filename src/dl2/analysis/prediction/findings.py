"""Potential-deadlock findings: predictions for the default configurations of a run.

Run when the recorded run itself has no deadlock.  Three predictions over one program:
gloo (every wildcard match explored), NCCL with its default 4 MiB buffer, and NCCL with
no buffer (to find exchanges that only NCCL's buffer saves, with the buffer size below
which they deadlock).  The same deadlock found under several of them is one finding.
A run recorded under an emulated configuration (``dl2 run --buffer-size``, ``dl2
replay``) is judged under that configuration only: the user chose it; ``dl2 predict``
explores the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from dl2.analysis.describe import history_gap
from dl2.analysis.describe import rank_list
from dl2.analysis.prediction.program import build_program
from dl2.analysis.prediction.search import Prediction
from dl2.analysis.prediction.search import Predictor
from dl2.analysis.prediction.semantics import GLOO
from dl2.analysis.prediction.semantics import NCCL
from dl2.analysis.prediction.semantics import recorded_semantics
from dl2.analysis.prediction.witness import Witness
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.wait_for import WaitForGraph
from dl2.report import Finding
from dl2.report import FindingKind
from dl2.report import OpRef
from dl2.trace.session import Session
from dl2.units import format_size

#: Runs with more ops than this are not predicted (a warning says so).
MAX_OPS = 200_000
#: States each configuration's search may run during ``analyze``.
MAX_STATES = 1000
#: States × ops the search of one configuration may copy during ``analyze``.
_WORK = 20_000_000
#: Wildcard matches an execution explored during ``analyze`` may take differently from
#: the recorded run.
MAX_DEVIATIONS = 2

_HINTS = {
    "wildcard": (
        "Do not rely on which sender a wildcard recv (src=None) meets first: receive from a "
        "named source, or give each sender its own tag."
    ),
    "batch": (
        "NCCL launches each batch_isend_irecv as one group: receive the sends of one batch "
        "with one batch on the peer (split both sides the same way)."
    ),
    "order": "Post operations that must progress together in one batch_isend_irecv.",
    "buffer": (
        "Do not rely on send buffering: let every send meet a posted receive (even ranks send "
        "first, odd ranks receive first), or post the exchange with isend/irecv or "
        "batch_isend_irecv."
    ),
}


@dataclass(frozen=True)
class _Case:
    """One configuration under which a deadlock was found."""

    prediction: Prediction
    witness: Witness
    below_default: bool  # found only with a buffer smaller than the default


def potential_deadlock_findings(
    session: Session, graph: ExecutionGraph, wfg: WaitForGraph
) -> tuple[list[Finding], list[str]]:
    """Potential deadlocks of a run that did not deadlock, and warnings about the search."""
    if wfg.deadlocked or not graph.timelines:
        return [], []
    total = graph.op_count
    if total == 0:
        return [], []
    if total > MAX_OPS:
        return [], [f"deadlock prediction skipped: {total:,} ops (the bound is {MAX_OPS:,})"]
    gap = history_gap(graph)
    if gap is not None:  # a prediction replays the whole program
        return [], [f"deadlock prediction skipped: {gap}"]
    recorded = recorded_semantics(session)
    # Each state copies the run's per-op flags: fewer states for a larger run.
    states = max(16, min(MAX_STATES, _WORK // total))
    predictor = Predictor(build_program(graph), max_states=states, max_deviations=MAX_DEVIATIONS)
    misfit = predictor.misfit(recorded)
    if misfit is not None:
        # A run that failed or was cut short is expected not to replay: say nothing then.
        if not _completed(graph):
            return [], []
        threaded = sorted(r for r, t in graph.timelines.items() if len({o.tid for o in t.ops}) > 1)
        if threaded:  # the replay takes a rank's ops in file order: one thread's program
            ranks = ", ".join(map(str, threaded))
            why = f"rank(s) {ranks} communicate from several threads, whose order it cannot replay"
            return [], [f"deadlock prediction skipped: {why}"]
        return [], [f"deadlock prediction skipped: {misfit}"]

    if recorded is not None and recorded != GLOO:
        # Run under an emulated configuration (dl2 run --buffer-size, dl2 replay): judged
        # under that configuration, and, when it buffered sends, with no buffer: an
        # exchange that completed only because its sends were buffered deadlocks where
        # they are not (NCCL's larger sends); `dl2 predict` explores the others.
        results = [(predictor.predict(recorded, recorded=recorded), False)]
        if recorded.eager_bytes > 0 and not recorded.fused_batches_atomic:
            results.append((predictor.predict(recorded.with_buffer(0), recorded=recorded), True))
    else:
        results = [
            (predictor.predict(GLOO, recorded=recorded), False),
            (predictor.predict(NCCL, recorded=recorded), False),
            (predictor.predict(NCCL.with_buffer(0), recorded=recorded), True),
        ]
    cut = [p for p, _ in results if not p.exhaustive]
    notes = (
        [
            f"deadlock prediction under {', '.join(p.semantics.label for p in cut)} stopped at "
            f"its bound of {states} states; other wildcard matches may deadlock too"
        ]
        if cut
        else []
    )
    groups: list[list[_Case]] = []  # cases whose deadlocks share a blocked op
    unfinished: frozenset[tuple[int, int]] | None = None  # read once, if a witness needs it
    for prediction, below in results:
        for witness in prediction.witnesses:
            if unfinished is None:
                unfinished = _unfinished_ops(graph)
            if all((b.rank, b.op_id) in unfinished for b in witness.blocked):
                continue  # what the run itself did (a peer failed): nothing new
            case = _Case(prediction, witness, below)
            touching = [
                g for g in groups if any(c.witness.signature & witness.signature for c in g)
            ]
            merged = [c for g in touching for c in g] + [case]
            groups = [g for g in groups if g not in touching] + [merged]
    findings = [_finding(_distinct(group)) for group in groups]
    return sorted(findings, key=lambda f: (f.ranks, f.message)), notes


def _unfinished_ops(graph: ExecutionGraph) -> frozenset[tuple[int, int]]:
    """(rank, op id) of the ops that did not complete in the recorded run (they raised,
    or were still pending when it ended): a predicted deadlock of those ops only is the
    recorded outcome again, not another one."""
    return frozenset(
        (rank, op.id)
        for rank, timeline in graph.timelines.items()
        for op in timeline.ops
        if op.error is not None or not op.completed
    )


def _completed(graph: ExecutionGraph) -> bool:
    """Whether every rank ended cleanly and every blocking op of it completed."""
    return all(
        t.ended is not None and all(op.completed or op.is_async for op in t.ops)
        for t in graph.timelines.values()
    )


def _distinct(cases: list[_Case]) -> list[_Case]:
    """One case per configuration; a smaller buffer only where the default has none."""
    kept: list[_Case] = []
    for case in cases:
        name = case.prediction.semantics.name
        if any(k.prediction.semantics == case.prediction.semantics for k in kept):
            continue
        if case.below_default and any(
            k.prediction.semantics.name == name and not k.below_default for k in cases
        ):
            continue
        kept.append(case)
    return kept


def _condition(case: _Case) -> str:
    """``under gloo``, ``under nccl when a send of N bytes exceeds the eager buffer (...)``."""
    semantics = case.prediction.semantics
    threshold = case.witness.threshold
    if not semantics.buffered:
        return f"under {semantics.name}"
    if case.below_default and semantics.name != "nccl":
        # an emulated buffer the run was recorded with, judged with none
        if threshold is not None:
            return f"when sends of {threshold:,} bytes or more are not buffered"
        return "when sends are not buffered"
    if case.below_default:
        default = NCCL.eager_bytes
        if threshold is not None and threshold <= default:
            return (
                f"under {semantics.name} when a send of {threshold:,} bytes exceeds the eager "
                f"buffer ({format_size(default)} buffer: no; < {format_size(threshold)}: yes)"
            )
        return f"under {semantics.name} with a buffer smaller than {format_size(default)}"
    if threshold is not None:
        return (
            f"under {semantics.name} when a send of {threshold:,} bytes exceeds the eager buffer "
            f"({format_size(semantics.eager_bytes)} buffer: yes; ≥ {format_size(threshold)}: no)"
        )
    return f"under {semantics.label}"


def _choice_phrase(witness: Witness) -> str:
    parts = []
    for choice in witness.deviations:
        recorded = (
            f" instead of rank {choice.recorded_sender} as recorded"
            if choice.recorded_sender is not None and choice.recorded_sender != choice.sender
            else ""
        )
        parts.append(
            f"rank {choice.rank}'s recv from any rank ({choice.recv.location}) matches rank "
            f"{choice.sender}{recorded}"
        )
    return "if " + ", then ".join(parts) if parts else ""


_STATE_NOTES = {
    "queued": " (queued behind an earlier op that cannot complete)",
}


def _blocked_phrase(witness: Witness) -> str:
    order = list(witness.cycle) + [r for r in witness.ranks if r not in witness.cycle]
    by_rank = {b.rank: b for b in witness.blocked}
    parts = []
    for rank in order:
        blocked = by_rank[rank]
        ref = blocked.ref
        size = f", {blocked.nbytes:,} bytes" if blocked.nbytes is not None else ""
        on = ""
        if blocked.waits_on and (ref.op not in ("send", "recv") or blocked.state != "unmatched"):
            on = f" waiting on {rank_list(blocked.waits_on)}"
        parts.append(
            f"rank {rank} is stuck in {_call(ref)} ({ref.location}{size}){on}"
            + (f" ({blocked.note})" if blocked.note else _STATE_NOTES.get(blocked.state, ""))
            + (
                f" ({blocked.queued} later op(s) of rank {rank} wait behind it)"
                if blocked.queued
                else ""
            )
        )
    return "; ".join(parts)


def _call(ref: OpRef) -> str:
    if ref.op in ("send", "recv"):
        peer = "any rank" if ref.peer is None else f"rank {ref.peer}"
        direction = "to" if ref.op == "send" else "from"
        if ref.api == "batch_isend_irecv":
            return f"the i{ref.op} {direction} {peer} of a batch_isend_irecv"
        name = ref.api if ref.api in ("isend", "irecv") else ref.op
        return f"{name} {direction} {peer}"
    name = ref.api if ref.api and ref.api != ref.op else ref.op
    return f"{name} on group {ref.group}"


def _finding(cases: list[_Case]) -> Finding:
    witness = cases[0].witness
    conditions = [_condition(c) for c in cases]
    head = "Deadlocks " + " and ".join(conditions)
    choice = _choice_phrase(witness)
    message = f"{head}{' ' + choice if choice else ''}: {_blocked_phrase(witness)}."
    causes = [cause for c in cases for cause in c.witness.causes]
    if not causes and any(b.ref.op == "send" for b in witness.blocked):
        causes.append("buffer")
    hint = next((_HINTS[c] for c in ("wildcard", "batch", "order", "buffer") if c in causes), "")
    if not hint:
        hint = "Make every blocking op meet its partner whatever the backend buffers or fuses."
    order = list(witness.cycle) + [r for r in witness.ranks if r not in witness.cycle]
    by_rank = {b.rank: b for b in witness.blocked}
    ops = [by_rank[r].ref for r in order] + [c.recv for c in witness.choices]
    groups = {b.ref.group for b in witness.blocked}
    return Finding(
        kind=FindingKind.POTENTIAL_DEADLOCK,
        ranks=tuple(sorted(witness.ranks)),
        ops=tuple(ops),
        message=message,
        hint=hint,
        cycle=witness.cycle,
        group=groups.pop() if len(groups) == 1 else None,
    )
