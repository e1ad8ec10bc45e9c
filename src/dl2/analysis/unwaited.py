"""Async P2P works never waited on: an ``isend``/``irecv`` whose Work was dropped without
``wait()``, or still outstanding when its rank's program ended.

gloo moves a P2P message only while both sides' works live; it reports a P2P work
complete only inside ``wait()`` (``is_completed()`` stays False until then).  A rank that
drops the work, or exits with it outstanding, may tear the pair down before the
transfer: the peer then hangs in its receive or fails with "Connection closed by peer",
now and then, even when this run happened to complete.

Reported: a send or receive whose work the rank dropped before it completed (a ``drop``
record: the recorder lets such a work go, as gloo does without dl2), and one issued
async, on a rank whose program ended, with no ``wait`` record, never seen complete (a
``done`` record: ``is_completed()`` returned True or the recorder saw it finish), and no
op of its batch waited on or complete (a wait on any work of a ``batch_isend_irecv``
counts for the batch). Not reported: collectives (gloo completes them without a wait;
DDP and FSDP wait on theirs in C++), blocking ops, eager sends of ``--buffer-size``
(delivered by the recorder), ops of ranks still running, ops no peer op matches
(``p2p-unmatched`` reports those).
One finding per source line and rank; O(ops kept).
"""

from __future__ import annotations

from collections import defaultdict

from dl2.analysis.describe import op_ref
from dl2.analysis.describe import phrase
from dl2.analysis.describe import where
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import op_key
from dl2.model.ops import Op
from dl2.model.stuck import RankStatus
from dl2.model.wait_for import WaitForGraph
from dl2.report import Finding
from dl2.report import FindingKind

__all__ = ["unwaited_work_findings"]

_HINT = (
    "Keep every Work that isend/irecv (or batch_isend_irecv) returns and call wait() on it "
    "before using the tensor, and before the rank exits or destroys its process group."
)


def _settled(op: Op) -> bool:
    return op.completed or op.waited_at is not None


def unwaited_work_findings(graph: ExecutionGraph, wfg: WaitForGraph) -> list[Finding]:
    """Async sends and receives dropped, or of ended ranks never waited on nor seen complete."""
    findings: list[Finding] = []
    for rank in sorted(graph.timelines):
        timeline = graph.timelines[rank]
        ended = timeline.ended is not None or wfg.status(rank) is RankStatus.EXITED
        # a rank still running: only its dropped works (not every op it kept built); one
        # whose program an uncaught exception ended never reached its waits: the
        # exception says why (the findings of its peers quote it), not a lost work
        raised = timeline.exit_error is not None
        ops = graph.dropped_ops(rank) if not ended or raised else timeline.ops
        if not ops:
            continue
        settled_batches = {op.batch for op in ops if op.batch is not None and _settled(op)}
        by_line: dict[tuple[str, str], list[Op]] = defaultdict(list)
        for op in ops:
            if (
                op.kind != "p2p"
                or not op.is_async
                or op.eager
                or op.error is not None
                or _settled(op)
                or (op.batch is not None and op.batch in settled_batches)
                # no partner: the p2p-unmatched finding says more
                or graph.p2p_partner.get(op_key(op)) is None
            ):
                continue
            by_line[(where(op), op.op)].append(op)
        for unwaited in by_line.values():
            findings.append(_finding(graph, unwaited))
    return findings


def _finding(graph: ExecutionGraph, ops: list[Op]) -> Finding:
    first = ops[0]
    times = f" ({len(ops)} works)" if len(ops) > 1 else ""
    ended = graph.timelines[first.rank].ended
    how = "destroyed its process group" if ended == "destroy" else "exited"
    name = first.api if first.api in ("isend", "irecv") else first.op
    peer = "any rank" if first.peer is None else f"rank {first.peer}"
    what = f"{name} {'to' if first.op == 'send' else 'from'} {peer}"
    if first.dropped:
        fate = "its Work was dropped before it completed. gloo never moves such a message"
    else:
        fate = (
            f"its Work was dropped or still outstanding when rank {first.rank} {how}. On "
            "gloo the transfer may never happen"
        )
    message = (
        f"rank {first.rank}'s {what} ({where(first)}){times} was never waited on: {fate}: "
        "the peer hangs, or fails with 'Connection closed by peer'."
    )
    partner = graph.p2p_partner.get(op_key(first))
    refs = [op_ref(first)]
    peers = {first.peer} if first.peer is not None else set()
    if partner is not None and partner.error is not None:
        message += (
            f" Rank {partner.rank}'s {phrase(partner)} ({where(partner)}) failed: {partner.error}."
        )
        refs.append(op_ref(partner))
    elif partner is not None and not partner.completed:
        message += f" Rank {partner.rank}'s {phrase(partner)} ({where(partner)}) waits on it."
        refs.append(op_ref(partner))
    return Finding(
        kind=FindingKind.UNWAITED_WORK,
        ranks=tuple(sorted({first.rank} | peers)),
        ops=tuple(refs),
        message=message,
        hint=_HINT,
        group=first.gid,
    )
