"""Findings from matching: collective mismatches, missing and unmatched ops, group misuse."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from collections.abc import Mapping
from collections.abc import Sequence

from dl2.analysis.describe import KILLED_HINT
from dl2.analysis.describe import exit_cause
from dl2.analysis.describe import op_ref
from dl2.analysis.describe import phrase
from dl2.analysis.describe import rank_list
from dl2.analysis.describe import where
from dl2.model.execution_graph import CollectiveSlot
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import call_key
from dl2.model.execution_graph import op_key
from dl2.model.ops import Op
from dl2.model.ops import Timeline
from dl2.model.stuck import RankStatus
from dl2.model.wait_for import WaitForGraph
from dl2.ranks import ranks_phrase
from dl2.report import Finding
from dl2.report import FindingKind
from dl2.report import OpRef
from dl2.report import frame_location
from dl2.trace.schema.decode import Frame
from dl2.trace.schema.decode import NewGroupRecord
from dl2.trace.schema.decode import report_frame

_FIELD_HINTS = {
    "op": (
        "Members issue different collectives at the same position of the group: issue "
        "collectives in the same order on every rank (look for a rank-dependent branch)."
    ),
    "root": "The root (src/dst) differs between ranks: pass the same root on every rank.",
    "redop": (
        "The reduce op differs between ranks; gloo completes this with a wrong result: use "
        "the same op on every rank."
    ),
    "dtype": (
        "The dtypes differ between ranks; same-size dtypes complete with garbage values: cast "
        "to one dtype before the collective."
    ),
    "count": (
        "The element counts differ between ranks (gloo aborts or hangs): the ranks passed "
        "different tensors at this call. When it sits in a loop over tensors, the ranks "
        "walked them in a different order or one skipped some (a dict or set filled in a "
        "data-dependent order, futures taken as they complete, `if p.grad is not None`): "
        "walk them in one fixed order (sorted names) and reduce the same ones on every "
        "rank, zeros for a missing one. When the one tensor really differs in size, pad "
        "it to the same size on every rank."
    ),
    "split_sizes": (
        "The all_to_all split sizes do not pair up: what rank i sends to rank j (its "
        "input_split_sizes[j]) must be what rank j expects from rank i (its "
        "output_split_sizes[i]). Exchange the counts first (an all_to_all_single of the "
        "sizes) and derive the output splits from them."
    ),
    "splits": (
        "The ranks fused different tensors into this coalesced collective (the sums mix "
        "unrelated tensors): decide the fusion buckets once, identically on every rank, not "
        "from each rank's own ready order."
    ),
}


#: the hint when the ranks reached one position from different lines (or call paths)
#: of the program
_SHIFTED_HINT = (
    "The ranks reached this collective from different lines of the program: they are "
    "not in the same call, so its {what} cannot agree. One rank issued a collective more "
    "(or one fewer) on this group before this point (a rank-dependent branch, a skipped "
    "step, a callback or hook that communicates on one rank only); compare each rank's "
    "collectives on the group up to here."
)
#: a mismatch of DDP's bucket all_reduce, which the user's code does not issue itself
_DDP_BUCKET_HINTS = {
    "dtype": (
        "DDP's gradient bucket all_reduce (issued during backward) has another dtype on "
        "some ranks: a compressing communication hook (fp16_compress_hook, "
        "bf16_compress_hook) registered on some ranks only, or models of different dtypes: "
        "register the same comm hook, and build the same model, on every rank."
    ),
    "count": (
        "DDP's gradient buckets (all_reduced during backward) differ in size between "
        "ranks: either the models differ (a layer added, frozen or left unused on some "
        "ranks), or DDP is set up differently on some ranks (bucket_cap_mb, "
        "find_unused_parameters, a comm hook or its settings, a Join or no_sync used on "
        "some ranks only): build the same model, with the same trainable parameters and "
        "the same DDP arguments, on every rank."
    ),
}
#: the same at a group's first collective: nothing came before it on the group
_FIRST_SHIFTED_HINT = (
    "The ranks reached the group's first collective from different lines of the program: "
    "they are not in the same call, so its {what} cannot agree. One rank took another path "
    "to it (a rank-dependent branch, a dispatch on rank-local state, a callback or hook "
    "that communicates on one rank only); make every rank issue the same call first."
)


def _mismatch_hint(
    differing: tuple[str, ...], op: str, ops: list[Op] | None = None, position: int = 1
) -> str:
    key = "op" if "op" in differing else differing[0]
    if (
        ops
        and op == "all_reduce"
        and key in ("dtype", "count")
        and any(o.api is None for o in ops)
        and len({o.frame for o in ops}) == 1
    ):
        # issued from C++ during backward, every rank at its backward line: DDP's bucket
        # all_reduce (or its comm hook's); another line on a rank is a shifted one
        return _DDP_BUCKET_HINTS[key]
    if key == "count" and ops and all(o.api == "broadcast_object_list" for o in ops):
        # its first collective broadcasts one size per object of the list
        return (
            "broadcast_object_list needs an object_list of the same length on every rank "
            "(the source's objects fill the others' lists): the ranks passed lists of "
            "different lengths. Size the list from a value every rank agrees on (the world "
            "size, a broadcast count)."
        )
    apis = {o.api for o in ops or () if o.api is not None}
    if len(apis) > 1 and key in ("count", "dtype", "redop", "root"):
        # the same position reached through different functions (all_gather_object on
        # one rank, all_gather on another): not a shift, two calls that differ
        called = "; ".join(
            f"{api} on {ranks_phrase(sorted({o.rank for o in ops or () if o.api == api}))}"
            for api in sorted(apis)
        )
        objects = any("object" in api for api in apis)
        why = (
            "; an object collective issues collectives of its own (sizes, then bytes), so "
            f"its {', '.join(differing)} cannot agree with another call's"
            if objects
            else ""
        )
        return (
            f"The ranks make different calls at this position ({called}){why}: make the "
            "same call on every rank."
        )
    # where each rank came from: its whole stack of the user's frames (one helper line
    # reached from two call sites is two paths)
    sites = {o.stack for o in ops or () if o.stack}
    if key in ("count", "dtype", "redop", "root") and len(sites) > 1:
        hint = _SHIFTED_HINT if position > 0 else _FIRST_SHIFTED_HINT
        return hint.format(what=", ".join(differing))
    if key == "splits" and op == "reduce_scatter":
        return (
            "The ranks cut the reduce_scatter input into shards of different sizes (shard i "
            "is what rank i receives; gloo hangs on this): give every rank the same shard "
            "sizes, padding the shards if needed."
        )
    return _FIELD_HINTS[key]


def _cut_short(graph: ExecutionGraph, rank: int) -> bool:
    """Whether the rank's trace ends in a partial record with no end record: the rank
    was killed while writing, or its disk filled; what it issued after is unknown (the
    warnings say so), not missing."""
    timeline = graph.timelines.get(rank)
    return timeline is not None and timeline.truncated and timeline.ended is None


def _threads_hint(graph: ExecutionGraph, slot: CollectiveSlot) -> str:
    """The cause when ranks issue a group's collectives from more than one thread: the
    threads interleave differently on each rank (a group is one queue per rank).  Read
    around the divergence only (each member's op there, at the next position and the
    calls it is still in on the group), whatever the history or the world."""
    gid = slot.gid
    after = graph.slot_at(gid, slot.index + 1)
    shared = []
    for rank, op in sorted(slot.ops.items()):
        near = [op, *(after.ops.values() if after is not None else ())]
        near += [o for o in graph.open_ops(rank) if o.gid == gid and o.kind == "collective"]
        tids = {o.tid for o in near if o.rank == rank}
        tids.discard(0)
        if len(tids) > 1:
            shared.append(rank)
    if not shared:
        return ""
    return (
        f"{rank_list(shared).capitalize()} issue{'s' if len(shared) == 1 else ''} "
        f"collectives on group {gid} from more than one thread, which interleave "
        "differently on each rank: give each thread a group of its own (dist.new_group) "
        "or serialise them. "
    )


def _exchange_sizes(op: Op) -> str:
    if not op.splits or len(op.splits) != 2:
        return ""
    return f" sending {list(op.splits[0])}, expecting {list(op.splits[1])}"


def collective_findings(graph: ExecutionGraph, wfg: WaitForGraph, job_ended: bool) -> list[Finding]:
    """The first divergence of each group, and collectives a gone rank never issued."""
    findings: list[Finding] = []
    for gid, slots in graph.divergent_slots().items():
        for slot in slots:
            if not slot.mismatched:
                continue
            ops = [slot.ops[r] for r in sorted(slot.ops)]
            paths = _paths(ops)
            # ranks that call alike are one side ("ranks 0-2 call all_reduce ... at ...")
            alike: dict[str, list[int]] = {}
            for o in ops:
                call = (
                    f"{o.op}"
                    + (f" ({o.signature})" if o.signature else "")
                    + (_exchange_sizes(o) if "split_sizes" in slot.differing else "")
                    + f" at {_where_apart(o, paths)}"
                )
                alike.setdefault(call, []).append(o.rank)
            sides = ", ".join(
                f"{rank_list(who)} call{'s' if len(who) == 1 else ''} {call}"
                for call, who in alike.items()
            )
            findings.append(
                Finding(
                    kind=FindingKind.COLLECTIVE_MISMATCH,
                    ranks=tuple(sorted(slot.ops)),
                    ops=tuple(op_ref(o) for o in ops),
                    message=(
                        f"First divergence on group {gid} at collective #{slot.index} "
                        f"({', '.join(slot.differing)} differ): {sides}."
                        + _mismatch_shift(graph, gid, ops, slot.index)
                    ),
                    hint=_threads_hint(graph, slot)
                    + _mismatch_hint(slot.differing, ops[0].op, ops, slot.index),
                    group=gid,
                )
            )
            break
        for slot in slots:
            if slot.mismatched or not slot.missing:
                continue
            gone = [
                r
                for r in slot.missing
                if (wfg.status(r).gone or job_ended) and not _cut_short(graph, r)
            ]
            if not gone:
                continue
            issued = [slot.ops[r] for r in sorted(slot.ops)]
            first = issued[0]
            causes = [(r, c) for r in gone if (c := exit_cause(graph, r))]
            why = ""
            killed = all(wfg.status(r) is RankStatus.KILLED for r in gone)
            if killed:
                why = f" {'It was' if len(gone) == 1 else 'They were'} killed by a signal first."
            elif len(gone) == 1 and causes:
                why = f" Its program ended with an uncaught {causes[0][1]}."
            elif causes:
                why = (
                    " Uncaught exceptions ended "
                    + "; ".join(f"rank {r}'s program ({c})" for r, c in causes[:3])
                    + "."
                )
            shift = "" if killed else _shift_text(graph, gid, sorted(slot.ops), gone, slot.index)
            hint = (
                "Every member of a group must issue each of its collectives: look for an "
                "early exit, a rank-dependent branch (a hook, a debug or logging path) or "
                "uneven data."
            )
            findings.append(
                Finding(
                    kind=FindingKind.COLLECTIVE_MISSING,
                    ranks=tuple(sorted({*gone, *slot.ops})),
                    ops=tuple(op_ref(o) for o in issued),
                    message=(
                        f"{rank_list(gone).capitalize()} never issued collective #{slot.index} of "
                        f"group {gid} ({first.op}), which {_issued_at(slot.ops)}.{why}{shift}"
                    ),
                    hint=KILLED_HINT if killed else hint,
                    group=gid,
                )
            )
            break
    return findings


def _issued_at(ops: Mapping[int, Op], limit: int = 3) -> str:
    """``ranks 0 and 2 issued at a.py:10``, or, where the ranks issued it from different
    lines, ``rank 0 issued at a.py:10, rank 2 at a.py:14`` (the first ``limit`` lines)."""
    # the ranks by stack first: one op_ref per distinct stack, not per rank (thousands
    # of ranks issue it from a handful of lines)
    by_stack: dict[tuple[object, ...], list[int]] = {}
    for rank in sorted(ops):
        by_stack.setdefault((ops[rank].stack, ops[rank].wait_stack), []).append(rank)
    by_line: dict[str, list[int]] = {}
    for ranks in by_stack.values():
        by_line.setdefault(where(ops[ranks[0]]), []).extend(ranks)
    parts = [f"{rank_list(sorted(ranks))} at {line}" for line, ranks in by_line.items()]
    text = parts[0].replace(" at ", " issued at ", 1) + "".join(
        f", {part}" for part in parts[1:limit]
    )
    if len(parts) > limit:
        text += f" and {len(parts) - limit} more lines"
    return text


def _sites(graph: ExecutionGraph, gid: str, rank: int, count: int) -> list[Op] | None:
    """The rank's first ``count`` collectives on ``gid``, or None when one is not kept."""
    found = []
    for index in range(count):
        slot = graph.slot_at(gid, index)
        op = slot.ops.get(rank) if slot is not None else None
        if op is None:
            return None
        found.append(op)
    return found


def _where_apart(op: Op, paths: Paths) -> str:
    """:func:`where` of ``op``, and, when another rank names the same line from another
    call path (``paths``: :func:`_paths` of the ranks' ops), the innermost line where
    the paths differ (``train.py:18, reached from train.py:31``)."""
    here = where(op)
    other = paths.get(op.frame, {}).get(op.stack)
    if other is not None:
        for mine, theirs in zip(op.stack, other, strict=False):
            if mine != theirs:
                return f"{here}, reached from {frame_location(mine)}"
    return here


#: named line -> a call path to it -> another path to the same line
Paths = dict[Frame | None, dict[tuple[Frame, ...], tuple[Frame, ...]]]


def _paths(ops: Sequence[Op]) -> Paths:
    """The named lines that ``ops`` reach by two call paths (the first two seen), each
    path mapped to the other: built once for all the ranks of a slot."""
    by_line: dict[Frame | None, list[tuple[Frame, ...]]] = {}
    for op in ops:
        stacks = by_line.setdefault(op.frame, [])
        if len(stacks) < 2 and op.stack not in stacks:
            stacks.append(op.stack)
    return {
        line: {stacks[0]: stacks[1], stacks[1]: stacks[0]}
        for line, stacks in by_line.items()
        if len(stacks) == 2
    }


#: how the sentence of :func:`_shift_text` starts: an explanation that needs the whole
#: history (a folded model, or a rank resumed from a checkpoint, gives the message
#: without it)
SHIFT_SENTENCE = " The two sides part earlier: "


def _shift_text(
    graph: ExecutionGraph, gid: str, ahead: list[int], behind: list[int], last: int
) -> str:
    """Where the ranks that issued collective #``last`` of ``gid`` (``ahead``) issued
    one more than those that did not (``behind``), or these skipped one: the first
    position at which their call paths differ, from which on ``ahead``'s collectives
    were issued where ``behind``'s one position earlier were (same signatures: the
    backend paired them one apart, silently).  "" when the paths do not show that, or
    the history is not all kept."""
    if not graph.complete:
        return ""
    a = _sites(graph, gid, ahead[0], last + 1)
    b = _sites(graph, gid, behind[0], last)
    if a is None or b is None:
        return ""
    sa, sb = [o.stack for o in a], [o.stack for o in b]
    k = next((i for i in range(last) if sa[i] != sb[i]), None)
    if k is None or sa[k + 1 :] != sb[k:]:
        return ""
    paths = _paths([a[k], b[k]])
    # whether the backend could notice: #k paired with #k, then each one apart (up to
    # the last common position), all of the same signatures
    alike = call_key(a[k]) == call_key(b[k]) and all(
        call_key(x) == call_key(y) for x, y in zip(a[k + 1 : last], b[k:], strict=False)
    )
    unnoticed = " (same signatures, so the backend did not notice)" if alike else ""
    return (
        f"{SHIFT_SENTENCE}{rank_list(ahead)}'s collective #{k} ({_where_apart(a[k], paths)}) "
        f"has no counterpart on {rank_list(behind)}, whose #{k} is at "
        f"{_where_apart(b[k], paths)}; from "
        f"there on their collectives paired one position apart{unnoticed}: "
        f"{rank_list(ahead)} issued one more there, or {rank_list(behind)} skipped it."
    )


def _mismatch_shift(graph: ExecutionGraph, gid: str, ops: list[Op], index: int) -> str:
    """:func:`_shift_text` for a mismatch at ``index``: of the first rank and the first
    whose call differs, either one ahead (collectives of equal signatures before it
    paired one apart, and this is where it showed)."""
    first = ops[0]
    other = next((o for o in ops if call_key(o) != call_key(first)), None)
    if other is None or index == 0:
        return ""
    for ahead, behind in ((first, other), (other, first)):
        text = _shift_text(graph, gid, [ahead.rank], [behind.rank], index)
        if text:
            return text
    return ""


def p2p_findings(graph: ExecutionGraph, job_ended: bool) -> list[Finding]:
    """Sends and receives left without a partner in a job that ended."""
    if not job_ended:
        return []
    findings: list[Finding] = []
    for rank in sorted(graph.timelines):
        for op in graph.p2p_ops(rank):
            if op_key(op) in graph.p2p_partner or op.completed:
                continue
            findings.append(
                Finding(
                    kind=FindingKind.P2P_UNMATCHED,
                    ranks=tuple(
                        sorted({rank, *([op.peer] if op.peer is not None and op.peer >= 0 else [])})
                    ),
                    ops=(op_ref(op),),
                    message=f"Rank {rank}'s {phrase(op)} at {where(op)} was never matched.",
                    hint="Post the matching operation on the peer, with the same tag and group.",
                    group=op.gid,
                )
            )
    return findings


def _open_wildcard_that_took(
    graph: ExecutionGraph, send: Op, open_any: dict[int, list[Op]]
) -> Op | None:
    """The receiver's wildcard recv that a completed, unmatched send went to: the
    receiver's only recv from any rank (same group and tag) left open, its sender never
    recorded (its rank died inside it: gloo aborts on a size difference).  ``open_any``
    caches each receiver's open wildcards (its P2P ops are read once)."""
    if not send.completed or send.eager or send.peer is None:
        return None  # an eager send completes without its receive
    timeline = graph.timelines.get(send.peer)
    if timeline is None or timeline.ended is not None:
        return None
    wildcards = open_any.get(send.peer)
    if wildcards is None:
        wildcards = open_any[send.peer] = [
            op
            for op in graph.p2p_ops(send.peer)
            if op.op == "recv" and op.peer is None and op.src is None and not op.completed
        ]
    found = [op for op in wildcards if op.gid == send.gid and (op.tag or 0) == (send.tag or 0)]
    return found[0] if len(found) == 1 else None


def p2p_mismatch_findings(graph: ExecutionGraph) -> list[Finding]:
    """Matched sends and receives whose dtype or element count differ.

    gloo aborts on a byte-size difference and silently reinterprets the bytes of a
    same-size dtype difference; either way the pair is wrong.
    """
    findings: list[Finding] = []
    open_any: dict[int, list[Op]] = {}
    for rank in sorted(graph.timelines):
        for send in graph.p2p_ops(rank):
            if send.op != "send":
                continue
            recv = graph.p2p_partner.get(op_key(send)) or _open_wildcard_that_took(
                graph, send, open_any
            )
            if recv is None:
                continue
            differing = [
                name
                for name, a, b in (
                    ("dtype", send.dtype, recv.dtype),
                    ("count", send.count, recv.count),
                )
                if a is not None and b is not None and a != b
            ]
            if not differing:
                continue
            findings.append(
                Finding(
                    kind=FindingKind.P2P_MISMATCH,
                    ranks=tuple(sorted({rank, recv.rank})),
                    ops=(op_ref(send), op_ref(recv)),
                    message=(
                        f"Rank {rank} sends {send.signature} at {where(send)} but rank "
                        f"{recv.rank} receives {recv.signature} at {where(recv)} "
                        f"({' and '.join(differing)} "
                        f"{'differ' if len(differing) > 1 else 'differs'})."
                    ),
                    hint=(
                        "Use the same dtype and number of elements on both sides of a "
                        "send/recv pair (gloo aborts on a size difference and reinterprets "
                        "the bytes of a same-size dtype)."
                    ),
                    group=send.gid,
                )
            )
    return findings


def _call_ref(
    rank: int, op: str, stack: Sequence[Frame], group: str | None = None, api: str | None = None
) -> OpRef:
    """A call that is no recorded op (new_group, a non-member's collective), at the line
    its stack names."""
    frame = report_frame(stack)
    return OpRef(
        rank=rank,
        op=op,
        group=group or "-",
        api=api or op,
        file=frame.file if frame else None,
        line=frame.line if frame else None,
        function=frame.function if frame else None,
    )


def _new_group_ref(rank: int, record: NewGroupRecord) -> OpRef:
    return _call_ref(rank, "new_group", record.stack, group=record.gid)


def group_findings(graph: ExecutionGraph) -> list[Finding]:
    """new_group calls that members skipped, or that ranks named differently.

    A rank whose trace starts at a checkpoint is left out: its earlier calls are absent.
    """
    calls: dict[tuple[int, ...], dict[int, list[NewGroupRecord]]] = defaultdict(dict)
    # group name -> its members as each rank created it -> (those ranks, a record)
    named: dict[str, dict[tuple[int, ...], tuple[list[int], NewGroupRecord]]] = {}
    known = {r: t for r, t in graph.timelines.items() if r not in graph.resumed}
    for rank, timeline in known.items():
        for record in timeline.newgroups:
            ranks = record.ranks
            members = tuple(sorted(ranks)) if ranks is not None else tuple(range(graph.world_size))
            calls[members].setdefault(rank, []).append(record)
            if record.gid is not None:
                sets = named.setdefault(str(record.gid), {})
                sets.setdefault(members, ([], record))[0].append(rank)
    findings: list[Finding] = _one_name_two_groups(named)
    # ranks still inside a group creation: they have not reached their later new_group
    # calls, which they did not skip (a rank that skipped one and went on is elsewhere)
    creating = {
        r
        for r, t in known.items()
        if t.ended is None
        and t.blocked is not None
        and any(o.op == "create_group" for o in t.blocked.ops)
    }
    for members, by_rank in sorted(calls.items()):
        counts = {r: len(by_rank.get(r, [])) for r in members if r in known}
        names = {r: tuple(str(c.gid) for c in by_rank.get(r, [])) for r in members if r in known}
        involved = tuple(members)
        hashed = False
        most = max(counts.values(), default=0)
        if any(n < most and r not in creating for r, n in counts.items()):
            short = [r for r, n in counts.items() if n < most]
            callers = [r for r, n in counts.items() if n == most]
            finding_ops = tuple(_new_group_ref(r, by_rank[r][-1]) for r in callers)
            message = (
                f"new_group(ranks={list(members)}) was called {most} time(s) by "
                f"{rank_list(callers)} but fewer times by {rank_list(short)}."
                + _other_members_here(known, short, by_rank[callers[0]][-1], members)
            )
        elif len({n for r, n in names.items() if counts[r] == most or r not in creating}) > 1:
            named_by = {r: n for r, n in names.items() if n}
            finding_ops = tuple(_new_group_ref(r, by_rank[r][0]) for r in sorted(by_rank))
            labels = "; ".join(f"rank {r}: {', '.join(n)}" for r, n in sorted(named_by.items()))
            hashed = any(local_sync_name(g) for n in named_by.values() for g in n)
            message = (
                f"Ranks gave the group of ranks {list(members)} different names ({labels}): "
                + (
                    "with use_local_synchronization=True torch names a group from its ranks and "
                    "the number of groups the calling rank already holds, and its members held "
                    "different numbers of groups when they created it (one created or destroyed "
                    "another group before)."
                    if hashed
                    else "some rank skipped an earlier new_group call."
                )
            )
        elif absent := [
            r for r in _skipped_by_nonmembers(known, members, by_rank) if r not in creating
        ]:
            involved = tuple(sorted({*members, *absent}))
            finding_ops = tuple(_new_group_ref(r, by_rank[r][0]) for r in sorted(by_rank))
            message = (
                f"new_group(ranks={list(members)}) was called by {rank_list(sorted(by_rank))} "
                f"but never by {rank_list(absent)}; every rank must call new_group, members or "
                "not (unless use_local_synchronization=True), or later groups pair up wrongly."
            )
        else:
            continue
        findings.append(
            Finding(
                kind=FindingKind.GROUP_MISMATCH,
                ranks=involved,
                ops=finding_ops,
                message=message,
                hint=LOCAL_SYNC_HINT if hashed else NEW_GROUP_HINT,
            )
        )
    return findings


def local_sync_name(gid: str) -> bool:
    """A group name torch hashed from the ranks (use_local_synchronization=True), not
    the counter ("1", "2", ...) of a globally synchronised new_group."""
    return not gid.isdigit()


NEW_GROUP_HINT = (
    "Call new_group on every rank, members and non-members alike, in the same order and "
    "with the same ranks."
)
#: a group created with use_local_synchronization=True (its name a hash, not a counter)
LOCAL_SYNC_HINT = (
    "Create (and destroy) groups so that every member of a use_local_synchronization group "
    "holds the same number of groups when it creates it (the same groups in the same order "
    "on each member), or create the groups without use_local_synchronization, on every rank."
)


def _other_members_here(
    known: dict[int, Timeline],
    short: list[int],
    record: NewGroupRecord,
    members: tuple[int, ...],
) -> str:
    """What the ranks that called new_group fewer times called at the same line instead
    (other members: each rank computed the list from its own data), or ""."""
    here = report_frame(record.stack)
    if here is None:
        return ""
    instead: dict[tuple[int, ...], list[int]] = {}
    for rank in short:
        for other in known[rank].newgroups:
            frame = report_frame(other.stack)
            ranks = other.ranks
            if frame is None or ranks is None or (frame.file, frame.line) != (here.file, here.line):
                continue
            if tuple(sorted(ranks)) != members:
                instead.setdefault(tuple(sorted(ranks)), []).append(rank)
                break
    if not instead:
        return ""
    calls = "; ".join(
        f"{rank_list(ranks)} called new_group(ranks={list(other)})"
        for other, ranks in sorted(instead.items())
    )
    return (
        f" At the same line ({here.line}), {calls} instead: the ranks computed different "
        "member lists; derive the list from what every rank agrees on (broadcast it, or "
        "all_reduce the decision first)."
    )


def _one_name_two_groups(
    named: dict[str, dict[tuple[int, ...], tuple[list[int], NewGroupRecord]]],
) -> list[Finding]:
    """A group name that ranks created with different members: they called new_group
    with different rank lists at the same point (or in different orders), and the one
    group joins ranks that disagree on who is in it."""
    findings = []
    for gid, sets in sorted(named.items()):
        if len(sets) < 2:
            continue
        parts = [
            f"{rank_list(sorted(creators))} created it as new_group(ranks={list(members)})"
            for members, (creators, _) in sorted(sets.items())
        ]
        findings.append(
            Finding(
                kind=FindingKind.GROUP_MISMATCH,
                ranks=tuple(sorted({r for creators, _ in sets.values() for r in creators})),
                ops=tuple(
                    _new_group_ref(min(creators), record)
                    for _, (creators, record) in sorted(sets.items())
                ),
                message=(
                    f"Group {gid} has different members on different ranks: "
                    + "; ".join(parts)
                    + ". The ranks called new_group with different rank lists in the same "
                    "place (or the same lists in different orders)."
                ),
                hint=(
                    "Build the lists of group ranks the same way on every rank (the same "
                    "groups in the same order, not 'my group first'), and call new_group for "
                    "each of them in that order."
                ),
                group=gid,
            )
        )
    return findings


def _skipped_by_nonmembers(
    known: Collection[int], members: tuple[int, ...], by_rank: dict[int, list[NewGroupRecord]]
) -> list[int]:
    """Traced ranks that never called a new_group that needed every rank.

    torch names groups created with the default global synchronisation by a counter
    ("1", "2", ...); use_local_synchronization=True gives a hashed name instead, and
    then only members need to call.
    """
    names = [c.gid for r in members for c in by_rank.get(r, []) if c.gid]
    if not names or any(local_sync_name(name) for name in names):
        return []
    return [r for r in known if r not in by_rank]


def nonmember_findings(graph: ExecutionGraph) -> list[Finding]:
    """Collectives called on a group the rank does not belong to (torch skips them)."""
    findings: list[Finding] = []
    for rank, timeline in sorted(graph.timelines.items()):
        for record in timeline.nonmember_calls:
            ref = _call_ref(rank, record.api or "collective", record.stack)
            findings.append(
                Finding(
                    kind=FindingKind.NONMEMBER_CALL,
                    ranks=(rank,),
                    ops=(ref,),
                    message=(
                        f"Rank {rank} called {ref.op} at {ref.location} on a group it is not a "
                        "member of; torch skips the call silently, so the rank does not take part."
                    ),
                    hint=(
                        "Guard the call with the group's membership, or add the rank to the group "
                        "if it must take part."
                    ),
                )
            )
    return findings
