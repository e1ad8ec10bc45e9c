"""Turning model ops into report references and short phrases."""

from __future__ import annotations

import os

from dl2.model.execution_graph import ExecutionGraph
from dl2.model.ops import Op
from dl2.ranks import ranks_phrase
from dl2.report import op_ref as op_ref  # re-exported: the analyses' import
from dl2.report import store_call
from dl2.trace.schema import NO_RANK
from dl2.trace.schema.decode import ThreadErrorRecord
from dl2.trace.schema.decode import report_frame

#: the fix hint of peers' failures whose cause is a rank killed by a signal from outside
KILLED_HINT = (
    "A signal ended that rank, sent from outside the job or by its own code (SIGKILL is "
    "most often the kernel's out-of-memory killer: check `dmesg` or the scheduler's logs, "
    "and the rank's memory use; a rank that signals itself, os.kill(os.getpid(), ...), "
    "ends so too); its peers failed because of it, not because of their own code."
)


def where(op: Op) -> str:
    """``train.py:42`` or ``?`` (from C++, no Python frame); an async op waited on at
    another line: ``train.py:42, waited at line 50``."""
    return op_ref(op).where


def phrase(op: Op) -> str:
    """A short description: ``send to rank 1``, ``all_reduce #3 on group 0``,
    ``store.get('ready')``."""
    if op.kind == "store":
        return store_call(op.op, op.signature)
    name = op.api if op.api and op.api not in ("isend", "irecv", "send", "recv") else op.op
    if op.op == "send":
        target = "no rank of its group" if op.peer == NO_RANK else f"rank {op.peer}"
        return f"{name} to {target}" + (f" (tag {op.tag})" if op.tag else "")
    if op.op == "recv":
        source = "any rank" if op.peer is None else f"rank {op.peer}"
        if op.peer == NO_RANK:
            source = "no rank of its group"
        return f"{name} from {source}" + (f" (tag {op.tag})" if op.tag else "")
    if op.op == "create_group":
        if op.api == "init_process_group":
            return "init_process_group"
        return f"new_group(ranks={list(op.ranks or ())})"
    seq = f" #{op.seq}" if op.seq is not None else ""
    label = op.op if name == op.op else f"{name} ({op.op})"
    return f"{label}{seq} on group {op.gid}"


def exit_cause(graph: ExecutionGraph, rank: int) -> str | None:
    """The uncaught exception that ended the rank's program, with the user's line that
    raised it (``ValueError: bad shard, raised at data.py:6 in load``); None when the
    program ended without one (or its trace does not say)."""
    timeline = graph.timelines.get(rank)
    if timeline is None or timeline.exit_error is None:
        return None
    frame = report_frame(timeline.exit_stack)
    if frame is None:
        return timeline.exit_error
    at = f"{os.path.basename(frame.file)}:{frame.line} in {frame.function}"
    return f"{timeline.exit_error}, raised at {at}"


def dead_threads(graph: ExecutionGraph | None, rank: int) -> tuple[ThreadErrorRecord, ...]:
    """The rank's threads that an uncaught exception ended."""
    timeline = graph.timelines.get(rank) if graph is not None else None
    return timeline.thread_errors if timeline is not None else ()


def thread_deaths(graph: ExecutionGraph, rank: int) -> list[str]:
    """:func:`dead_threads`, each as "rank 1's thread 'sender' ended with an uncaught
    KeyError: 'k', raised at x.py:14 in send_loop"."""
    deaths = []
    for died in dead_threads(graph, rank):
        frame = report_frame(died.stack)
        at = (
            f", raised at {os.path.basename(frame.file)}:{frame.line} in {frame.function}"
            if frame is not None
            else ""
        )
        deaths.append(f"rank {rank}'s thread {died.name!r} ended with an uncaught {died.err}{at}")
    return deaths


def rank_list(ranks: tuple[int, ...] | list[int]) -> str:
    """``rank 3`` / ``ranks 0 and 1`` / ``ranks 0, 1 and 2`` / ``ranks 2-8191``."""
    return ranks_phrase(ranks)


def history_gap(graph: ExecutionGraph) -> str | None:
    """Why the graph lacks part of the history (folded ops, ranks resumed from a
    checkpoint), or None when it has every op."""
    if graph.complete:
        return None
    parts = []
    if graph.folded_ops:
        parts.append(
            f"{graph.folded_ops:,} of the {graph.op_count:,} ops are folded (finished "
            "history beyond the model's window)"
        )
    if graph.resumed:
        parts.append(
            f"the traces of {rank_list(sorted(graph.resumed))} start at a checkpoint "
            "(their earlier segments were rotated away)"
        )
    return "; ".join(parts)
