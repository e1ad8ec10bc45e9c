"""Deadlock, orphaned-wait and hang-suspect findings from the wait-for graph."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise

from dl2.analysis.describe import KILLED_HINT
from dl2.analysis.describe import dead_threads
from dl2.analysis.describe import exit_cause
from dl2.analysis.describe import op_ref
from dl2.analysis.describe import phrase
from dl2.analysis.describe import rank_list
from dl2.analysis.describe import thread_deaths
from dl2.analysis.describe import where
from dl2.analysis.matching import LOCAL_SYNC_HINT
from dl2.analysis.matching import NEW_GROUP_HINT
from dl2.analysis.matching import local_sync_name
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import op_key
from dl2.model.ops import Frame
from dl2.model.ops import Op
from dl2.model.stuck import RankStatus
from dl2.model.stuck import deadlock_set
from dl2.model.stuck import shortest_cycle
from dl2.model.wait_for import Clause
from dl2.model.wait_for import RankNode
from dl2.model.wait_for import WaitForGraph
from dl2.model.wait_for import clause_for
from dl2.report import Finding
from dl2.report import FindingKind
from dl2.trace.schema.decode import report_frame

_ORPHAN_HINT = (
    "A rank exited while others still needed it: every rank must issue the same "
    "communication before exiting (same number of steps, no early return)."
)
_DDP_HINT = " DDP issued this collective from backward: for uneven inputs use `with model.join():`."
_DDP_FORWARD_HINT = (
    " DDP broadcasts from C++ when it is built (its parameters) and in every forward pass "
    "(its buffers, broadcast_buffers=True): build the DDP model on every rank, and run a "
    "forward pass on some ranks only (an evaluation on rank 0) through model.module."
)


def _ddp_hint(op: Op) -> str:
    """What to add to a hint about an op torch issued from C++ (DDP's), if anything."""
    if op.api is not None or op.kind != "collective":
        return ""
    return _DDP_FORWARD_HINT if op.op == "broadcast" else _DDP_HINT


#: the note of a second wait on a send or receive (:func:`_rewait_note`), and its fix
_REWAIT = "waits a second time on the work of its"
_REWAIT_HINT = (
    "Call wait() once per isend/irecv work (keep a flag, or drop the work after its "
    "wait): on gloo each wait() on a send or receive waits for one more message; a "
    "collective's work may be waited on again, a P2P work may not."
)


def _rewait_note(wfg: WaitForGraph, op: Op) -> str:
    """Why a second wait on a send or receive never returns, naming both waits (the
    first named as the report names a wait: its line, its file too if another)."""
    node = wfg.nodes.get(op.rank)
    first = ""
    if node is not None and node.blocked is not None and node.blocked.earlier:
        ref = op_ref(replace(op, wait_stack=node.blocked.earlier))
        first = f" ({ref.wait_location or f'line {ref.line}'})"
    name = op.api if op.api in ("isend", "irecv") else op.op
    peer = f" {'to' if op.op == 'send' else 'from'} rank {op.peer}" if op.peer is not None else ""
    return (
        f"rank {op.rank} {_REWAIT} {name}{peer} ({where(op)}), whose first wait returned"
        f"{first}: gloo's wait() on a send or receive waits for one more message each "
        "time, so this one never returns"
    )


def _stuck_op(node: RankNode) -> Op:
    return node.clauses[0].op


#: (group, receiver) -> the sends ranks are blocked in toward it
Senders = dict[tuple[str, int], list[Op]]


def _blocked_senders(wfg: WaitForGraph) -> Senders:
    """The sends the waiting ranks are blocked in, by (group, receiver): built once per
    analysis, not per clause or per part of the deadlock set."""
    found: Senders = {}
    for node in wfg.waiting.values():
        if node.clauses:
            sent = _stuck_op(node)
            if sent.op == "send" and sent.peer is not None:
                found.setdefault((sent.gid, sent.peer), []).append(sent)
    return found


def _clause_note(
    graph: ExecutionGraph, wfg: WaitForGraph, clause: Clause, senders: Senders
) -> str | None:
    """Why a blocked op cannot complete, when more can be said than its clause: an
    unmatched P2P op's wrong tag or wrong peer, if visible (``senders``:
    :func:`_blocked_senders` of ``wfg``), or the other groups its group's name stands
    for on other ranks."""
    op = clause.op
    if clause.reason == "rewait":
        return _rewait_note(wfg, op)
    if clause.reason == "group-views":
        return _views_note(graph, op)
    if clause.reason == "no-rank":
        members = graph.group_members(op.gid)
        return (
            f"rank {op.rank} {op.op}s {'to' if op.op == 'send' else 'from'} a rank that is "
            f"not in group {op.gid} ({rank_list(list(members))}): nothing can ever match it"
        )
    if clause.reason == "dropped":
        partner = graph.p2p_partner.get(op_key(op))
        if partner is not None:
            name = partner.api if partner.api in ("isend", "irecv") else partner.op
            return (
                f"rank {partner.rank} dropped the Work of its matching {name} "
                f"({where(partner)}) without wait(): gloo never moves that message"
            )
    if op.op == "recv" and op.peer is None:
        # a receive from any rank: the sends blocked toward it, all under other tags
        coming = senders.get((op.gid, op.rank), [])
        if coming and all((s.tag or 0) != (op.tag or 0) for s in coming):
            first = coming[0]
            return (
                f"tags differ: rank {op.rank} receives from any rank with tag {op.tag or 0}, "
                f"rank {first.rank} is blocked sending to it ({where(first)}) with tag "
                f"{first.tag or 0}"
            )
    if op.kind != "p2p" or op.peer is None:
        return None
    peer_node = wfg.nodes.get(op.peer)
    if peer_node is None or not peer_node.clauses:
        return None
    other = _stuck_op(peer_node)
    want = "recv" if op.op == "send" else "send"
    toward = "to" if op.op == "send" else "from"
    if other.op == want and other.peer == op.rank and other.gid != op.gid:
        back = "from" if toward == "to" else "to"
        verbs = {"send": "sends", "recv": "receives"}
        return (
            f"groups differ: rank {op.rank} {verbs[op.op]} {toward} rank {op.peer} on group "
            f"{op.gid}, rank {op.peer} {verbs[other.op]} {back} rank {op.rank} on group "
            f"{other.gid}"
        )
    if not (other.op == want and other.gid == op.gid and other.peer == op.rank):
        # the peer waits elsewhere: its pending op for this rank (an isend posted, not
        # yet waited on) may be there, with another tag
        sender, receiver = (op.peer, op.rank) if want == "send" else (op.rank, op.peer)
        pending = [
            o
            for o in graph.p2p_unmatched(op.gid, sender, receiver, want)
            if not o.completed  # an eager send completes unmatched
        ]
        if pending and all(o.tag != op.tag for o in pending):
            first = pending[0]
            name = first.api if first.api in ("isend", "irecv") else first.op
            back = "from" if toward == "to" else "to"
            return (
                f"tags differ: rank {op.rank} {op.op}s {toward} rank {op.peer} with tag "
                f"{op.tag or 0}, rank {op.peer}'s pending {name} {back} rank {op.rank} "
                f"({where(first)}) uses tag {first.tag or 0}"
            )
    if other.op == want and other.gid == op.gid:
        other_peer = other.peer
        if other_peer == op.rank and other.tag != op.tag:
            return (
                f"tags differ: rank {op.rank} uses tag {op.tag or 0}, "
                f"rank {other.rank} uses tag {other.tag or 0}"
            )
        if other_peer is not None and other_peer != op.rank and other_peer >= 0:
            return (
                f"wrong peer or order: rank {op.rank} {op.op}s "
                f"{'to' if op.op == 'send' else 'from'} rank {op.peer}, but rank {other.rank} "
                f"{other.op}s {'to' if other.op == 'send' else 'from'} rank {other_peer} first"
            )
    if other.kind != "p2p" and op.op == "recv":
        # another rank blocked sending to this one: the receive names the wrong peer
        crossed = next(
            (sender for sender in senders.get((op.gid, op.rank), ()) if sender.rank != op.peer),
            None,
        )
        if crossed is not None:
            return (
                f"wrong peer: rank {crossed.rank} is blocked sending to rank {op.rank} "
                f"({where(crossed)}), which receives from rank {op.peer}, and rank {op.peer} "
                f"went on to {phrase(other)}"
            )
        # the sender went on to a collective (or a store call): did it send its part?
        # (with no send at all, not when the receiver never issued that collective: it
        # may have skipped it, the sender's send coming after it)
        sends, recvs = graph.p2p_issued(op.gid, op.peer, op.rank)
        slot = graph.slot_of(other) if other.kind == "collective" and not sends else None
        skipped = (
            slot is not None
            and op.rank in graph.group_members(other.gid)
            and op.rank not in slot.ops
        )
        if 0 < sends < recvs and not skipped:
            return _send_short(op, other, sends, recvs)
        if sends == 0 and not skipped:
            # nothing sent yet: skipped, or simply later than the op it waits in (the
            # trace cannot tell): the order is the fact
            return (
                f"not sent yet: rank {op.peer} has sent nothing to rank {op.rank} and waits "
                f"in {phrase(other)} ({where(other)}) first"
            )
    if op.op == "recv" and other.op == "recv" and other.peer == op.rank and other.gid == op.gid:
        # both receive from each other: after sends that did meet their receives, one
        # count short (a pipeline stage that runs one microbatch less), not the order of
        # a first exchange (which the "receives first" hint is about)
        sends, recvs = graph.p2p_issued(op.gid, op.peer, op.rank)
        if 0 < sends < recvs:
            return _send_short(op, other, sends, recvs)
    return None


def _misdirected(wfg: WaitForGraph, cycle: tuple[int, ...], members: list[int]) -> list[str]:
    """Notes of ranks waiting on the cycle from outside it: one receives from a rank of
    the cycle that is blocked sending to another rank.  Its send may come later (a
    ring's order) or have gone to the wrong rank (a reply to a group rank taken for a
    global one): the trace cannot tell, so the note states the two facts."""
    on_cycle = set(cycle)
    notes = []
    for rank in members:
        node = wfg.nodes.get(rank)
        if rank in on_cycle or node is None or not node.clauses:
            continue
        op = _stuck_op(node)
        peer = wfg.nodes.get(op.peer) if op.op == "recv" and op.peer in on_cycle else None
        if peer is None or not peer.clauses:
            continue
        sending = _stuck_op(peer)
        if sending.op == "send" and sending.gid == op.gid and sending.peer != rank:
            notes.append(
                f"rank {rank} waits to receive from rank {sending.rank} ({where(op)}), "
                f"which is blocked sending to rank {sending.peer} instead"
            )
    return notes


def _send_short(op: Op, other: Op, sends: int, recvs: int) -> str:
    """The note of receive ``op`` whose peer issued ``sends`` sends to it, fewer than its
    receives, and went on to ``other``."""
    return (
        f"one send short: rank {op.peer} issued {sends} send{'' if sends == 1 else 's'} "
        f"to rank {op.rank}, whose recv from rank {op.peer} is its number {recvs}, "
        f"and went on to {phrase(other)}"
    )


def _views_note(graph: ExecutionGraph, op: Op) -> str:
    """'group 3 is not the same group on every rank: rank 0 created it as
    new_group(ranks=[0, 3]), ranks 2 and 3 as new_group(ranks=[2, 3])'."""
    views = graph.group_views(op.gid)
    mine = next((ranks for ranks, creators in views.items() if op.rank in creators), None)
    others = sorted(
        (sorted(creators), ranks) for ranks, creators in views.items() if op.rank not in creators
    )
    where_else = "; ".join(
        f"{rank_list(creators)} as new_group(ranks={list(ranks or ())})"
        for creators, ranks in others
    )
    return (
        f"group {op.gid} {_GROUP_VIEWS}: rank {op.rank} created it as "
        f"new_group(ranks={list(mine or ())}), {where_else}"
    )


#: in the note of an op on a group whose name means other groups elsewhere
_GROUP_VIEWS = "is not the same group on every rank"

_GROUP_VIEWS_HINT = (
    "Create the groups in the same order, with the same ranks, on every rank (new_group, "
    "new_subgroups, DeviceMesh): a group's name is given in creation order, so ranks that "
    "create groups in different orders give one name to different groups, whose "
    "collectives never meet."
)


def _skipped_collective(ops: list[Op], graph: ExecutionGraph | None) -> str | None:
    """'Rank 1 never issued all_reduce #0 on group 0, which rank 0 waits in: ...' when a
    rank of the cycle waits in a point-to-point op without having issued the collective
    another rank of the cycle waits in."""
    if graph is None:
        return None
    for held in ops:
        slot = graph.slot_of(held) if held.kind == "collective" else None
        if slot is None:
            continue
        members = graph.group_members(held.gid)
        for other in ops:
            if other.kind == "p2p" and other.rank in members and other.rank not in slot.ops:
                # the side of the exchange rank held.rank was to take before the collective
                side = "receive" if other.op == "send" else "send"
                return (
                    f"Rank {other.rank} never issued {phrase(held)}, which rank {held.rank} "
                    f"waits in ({where(held)}), and waits in {phrase(other)} instead: "
                    "either it skipped the collective (a rank-dependent branch, an early "
                    "continue, an async op issued on some ranks only), or rank "
                    f"{held.rank} meant to {side} before it. Issue the collective on every "
                    "member, and the exchange on the same side of it on both ranks."
                )
    return None


_STORE_HINT = (
    "A store.get/store.wait returns only once some rank sets its key, and every rank that "
    "could set it waits itself (on the waiting rank, or on each other) or has ended: set "
    "the key before entering communication the waiting rank has not reached, and make "
    "sure no rank skips the code that sets it."
)


def _store_keys_text(op: Op) -> str:
    return "a key" if len(op.keys or ()) == 1 else "keys"


def _blocked_text(op: Op) -> str:
    verb = "waits in" if op.kind == "store" else "is blocked in"
    return f"rank {op.rank} {verb} {phrase(op)} ({where(op)})"


def _store_finding(wfg: WaitForGraph, node: RankNode) -> Finding:
    """A rank waiting for store keys that no rank left can set (off any wait cycle)."""
    op = _stuck_op(node)
    others = [t for t in node.targets if wfg.status(t).gone or t in wfg.deadlocked]
    parts = [
        f"rank {t} {wfg.status(t)}"
        if wfg.status(t).gone
        else _blocked_text(_stuck_op(wfg.nodes[t]))
        for t in others
    ]
    reason = ": " + "; ".join(parts) if parts else " (it is the only rank)"
    return Finding(
        kind=FindingKind.DEADLOCK,
        ranks=tuple(sorted({op.rank, *others})),
        ops=(op_ref(op), *(op_ref(_stuck_op(wfg.nodes[t])) for t in others if t in wfg.waiting)),
        message=(
            f"Rank {op.rank} waits in {phrase(op)} ({where(op)}) for {_store_keys_text(op)} "
            f"no other rank will set{reason}."
        ),
        hint=_STORE_HINT,
    )


def _gone_states(graph: ExecutionGraph, wfg: WaitForGraph, gone: Sequence[int]) -> str:
    """``rank 1 failed (ValueError: ..., raised at data.py:6 in load); rank 2 exited``."""
    causes = [exit_cause(graph, rank) for rank in gone]
    parts = [
        (
            f"rank {rank} was killed by a signal"
            if wfg.status(rank) is RankStatus.KILLED
            else f"rank {rank} {wfg.status(rank)}"
        )
        + (f" ({cause})" if cause else "")
        for rank, cause in zip(gone, causes, strict=True)
    ]
    return ("; " if any(causes) else ", ").join(parts)


def _unreached(graph: ExecutionGraph | None, ops: list[Op]) -> tuple[str, int]:
    """Of ranks waiting in collectives of different groups: the first whose group's
    collective another of them has not issued, with the counts that show it ("Rank 2
    waits in all_reduce #3 on group 2, which rank 3 has not issued: it issued 3 on
    group 2 and went on to barrier #0 on group 0. "), and that rank's count on the
    group; ("", 0) when none."""
    if graph is None:
        return "", 0
    first: dict[str, tuple[Op, int]] = {}  # group -> the first op waiting on it, its seq
    for waiting in ops:
        if waiting.kind == "collective" and waiting.seq is not None:
            first.setdefault(waiting.gid, (waiting, waiting.seq))
    for gid, (waiting, seq) in first.items():
        members = frozenset(graph.group_members(gid))
        for other in ops:
            if other.gid == gid or other.rank not in members:
                continue
            issued = graph.issued_count(waiting.gid, other.rank)
            if issued > seq:
                continue
            return (
                f"Rank {waiting.rank} waits in {phrase(waiting)}, which rank {other.rank} "
                f"has not issued: it issued {issued} on group {waiting.gid} and went on to "
                f"{phrase(other)}. "
            ), issued
    return "", 0


def _hint(ops: list[Op], notes: list[str], graph: ExecutionGraph | None = None) -> str:
    if any(_REWAIT in n for n in notes):
        return _REWAIT_HINT
    kinds = {o.op for o in ops}
    died = [(r, t.name) for r in sorted({o.rank for o in ops}) for t in dead_threads(graph, r)]
    if died and kinds not in ({"send"}, {"recv"}):
        # (a send/send or recv/recv cycle is the main threads' own order: a thread that
        # died there is only noted)
        rank, name = died[0]
        return (
            f"Rank {rank}'s thread {name!r} died before doing its part (what it was to "
            "send, set or issue never comes): fix its exception, and let a helper "
            "thread's failure reach the main thread (keep its future, or join it and "
            "re-raise) so that the rank fails instead of waiting."
        )
    if any("without wait()" in n for n in notes):
        return (
            "Keep the Work that isend/irecv (or batch_isend_irecv) returns and call wait() on "
            "it: a dropped P2P work never transfers on gloo."
        )
    if any(_GROUP_VIEWS in n for n in notes):
        return _GROUP_VIEWS_HINT
    if any(o.kind == "store" for o in ops):
        return _STORE_HINT
    if any(n.startswith("groups differ") for n in notes):
        return (
            "A send meets only a receive on the same group: take each pair's send and receive "
            "on one group on both sides (a send on one group and a receive on another never "
            "match), and the groups' point-to-point calls in the same order."
        )
    if any(n.startswith("tags differ") for n in notes):
        return (
            "The two sides of a send/recv pair must use the same tag. If the tags are meant "
            "to differ (two streams of messages, each with its tag), the two sides take "
            "them in different orders: post every receive (irecv) before waiting on any, "
            "or send with isend, so that neither side waits for a message the other sends "
            "after its own wait."
        )
    if any("a rank that is not in group" in n for n in notes):
        return (
            "The peer rank is out of range: compute it modulo the group's size (a ring's "
            "(rank + 1) % world_size), and pass group ranks only as group_dst/group_src."
        )
    short = next((n for n in notes if n.startswith("one send short: rank ")), None)
    if short is not None:
        quiet = short.removeprefix("one send short: rank ").split(" ", 1)[0]
        return (
            f"Rank {quiet} went on without the send its peer waits for (a "
            "rank-dependent branch, a hook or no_grad path that skips it, a loop that ends "
            "early on one side): issue the same sends and receives on both sides, in the "
            "same order."
        )
    if any(n.startswith("wrong peer") for n in notes):
        return (
            "Each send must meet its receive: check that every send names its receiver and "
            "every receive its sender, then that both sides take their messages in the same "
            "order (a rank that sends to two peers in one order while they receive in "
            "another cycles); post the receives early with irecv, or batch_isend_irecv."
        )
    if kinds == {"send"} and all(o.is_async for o in ops):
        return (
            "The sends are already isend (posted, then waited on): what is missing is their "
            "receives. The ranks disagree on who pairs with whom (a rank sends to a peer "
            "that receives from, or sends to, a third): derive the pairing on every rank "
            "from one shared value (the same seed, or a broadcast), so that each send has "
            "its receive posted."
        )
    if kinds == {"send"}:
        parities = {o.rank % 2 for o in ops}
        if len(parities) == 1 and len(ops) > 1:
            # an even/odd order is what these ranks may already follow
            who = sorted({o.rank for o in ops})
            alike = f"{'both' if len(who) == 2 else 'all'} {'even' if parities == {0} else 'odd'}"
            return (
                "Every rank in the cycle sends first and a gloo send waits for its receive "
                f"(so does NCCL above its eager buffer); {rank_list(who)} are {alike}, "
                "so ordering by parity does not "
                "separate them (a ring of an odd number of ranks has such neighbours): make "
                "one of them receive first, or use isend/irecv or batch_isend_irecv."
            )
        return (
            "Every rank in the cycle sends first and a gloo send waits for its receive (so does "
            "NCCL above its eager buffer): let even ranks send first and odd ranks receive first, "
            "or use isend/irecv or batch_isend_irecv."
        )
    if kinds == {"recv"} and all(o.is_async for o in ops):
        return (
            "The receives are already irecv, but each rank waits on them before posting the "
            "sends its peers wait for: post the sends (isend) before waiting on the receives, "
            "or exchange with batch_isend_irecv."
        )
    if kinds == {"recv"}:
        if any(o.is_async for o in ops):  # some already irecv: their sends come late
            return (
                "Every rank in the cycle receives first: make one side send first, or post "
                "the receives with irecv and the sends with isend before waiting on either."
            )
        return (
            "Every rank in the cycle receives first: make one side send first, or post the "
            "receive with irecv before sending."
        )
    if "create_group" in kinds:
        creations = [o for o in ops if o.op == "create_group"]
        if any(local_sync_name(o.gid or "0") for o in creations):
            return LOCAL_SYNC_HINT  # a hashed name: use_local_synchronization=True
        return NEW_GROUP_HINT
    groups = {o.gid for o in ops if o.kind == "collective"}
    if len(groups) > 1:
        listed = ", ".join(sorted(groups))
        unreached, issued = _unreached(graph, ops)
        if unreached:
            skipped = (
                "it skipped one of that group's collectives, or the others issued one more "
                "(a rank-dependent branch, a hook or a no_grad path taken on some ranks "
                "only: compare the ranks' calls on the group)"
            )
            ordered = (
                "the ranks issue the groups' collectives in different orders (issue them in "
                "the same order on every rank)"
            )
            # at a group's first collective there is nothing to skip before it: the
            # order comes first
            first, second = (ordered, skipped) if issued == 0 else (skipped, ordered)
            return (
                f"{unreached}Either {first}, or {second}, or a rank passes another group "
                "than its peers."
            )
        return (
            f"The ranks wait in collectives of different groups (groups {listed}): "
            "either they issue the groups' collectives in different orders (issue them in the "
            "same order on every rank), or a rank passes another group than its peers (the "
            "same call with group=... on some ranks only), or a rank destroyed or skipped a "
            "group the others still use."
        )
    if all(o.kind == "collective" for o in ops):
        # the earliest position a rank waits at: the others went past it (a root that
        # sent its broadcast, say), so theirs is not where the ranks part
        seqs = [o.seq for o in ops if o.seq is not None]
        at = min(seqs) if seqs else None
        see = (
            "the first divergence" if at is None else f"the mismatch at #{at} on group {ops[0].gid}"
        )
        if len({(o.op, o.seq) for o in ops}) == 1:
            return (
                f"The ranks wait in the same collective with arguments that do not agree "
                f"(see {see}): pass the same root, reduce op and sizes on every rank."
            )
        return (
            f"The ranks are in different collectives of the same group (see {see}): "
            "make every member issue the same collectives in the same order; look for a "
            "rank-dependent branch."
        )
    if not any(o.kind == "collective" for o in ops):
        return (
            "Each rank waits in a point-to-point op that its peer never matches: check that "
            "every send names its receiver, every receive its sender and both the same tag, "
            "and that both sides take their messages in the same order."
        )
    skip = _skipped_collective(ops, graph)
    if skip is not None:
        return skip
    return (
        "A rank waits in a point-to-point op while its peer waits in another operation: make "
        "each send meet its receive before either side enters the next collective."
    )


#: ranks of a deadlock set without a cycle whose ops are explained (the first ones)
_NOTED_RANKS = 64


def deadlock_findings(graph: ExecutionGraph, wfg: WaitForGraph) -> list[Finding]:
    """The deadlock cycle (or the orphaned chain) and each orphaned wait, for each part
    of the deadlock set that waits on no other part (two independent deadlocks, in two
    halves of a mesh say, are two findings)."""
    if not wfg.deadlocked:
        return []
    findings: list[Finding] = []
    senders = _blocked_senders(wfg)  # once for every part: W ranks may make W/2 parts
    for part in _independent_parts(wfg):
        findings.extend(_deadlock_part(graph, wfg, part, _root_cycle(wfg, part), senders))
    return findings


def _root_cycle(wfg: WaitForGraph, part: Sequence[int]) -> tuple[int, ...]:
    """The shortest cycle of waits that every rank on it needs met: no wildcard receive
    that any of several senders can release is on it (a cascade behind a send/send
    pair: the pair is the cycle, the wildcard waits behind it); else the shortest cycle
    of all the waits."""
    needed: dict[int, Sequence[int]] = {}
    for rank in part:
        clauses = [
            clause
            for clause in wfg.nodes[rank].clauses
            if not clause.any_of or len(clause.targets) == 1
        ]
        # one clause: its own tuple, which the ranks blocked in the same slot share
        needed[rank] = (
            clauses[0].targets
            if len(clauses) == 1
            else tuple(target for clause in clauses for target in clause.targets)
        )
    return shortest_cycle(needed) or shortest_cycle({r: wfg.nodes[r].targets for r in part})


def _independent_parts(wfg: WaitForGraph) -> list[list[int]]:
    """The deadlock set split into the parts no wait edge joins (in either direction),
    each ascending, ordered by their lowest rank."""
    parent = {r: r for r in wfg.deadlocked}

    def root(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    def join(a: int, b: int) -> None:
        a, b = root(a), root(b)
        if a != b:
            parent[max(a, b)] = min(a, b)

    # a targets tuple shared by the ranks blocked in one slot is joined once (its ranks
    # together, then each waiting rank to its first): linear in the distinct tuples
    firsts: dict[int, tuple[tuple[int, ...], int | None]] = {}
    for rank in wfg.deadlocked:
        for clause in wfg.nodes[rank].clauses:
            targets = clause.targets
            known = firsts.get(id(targets))
            if known is None or known[0] is not targets:
                inside = [t for t in targets if t in parent]
                for a, b in pairwise(inside):
                    join(a, b)
                known = firsts[id(targets)] = (targets, inside[0] if inside else None)
            if known[1] is not None:
                join(rank, known[1])
    parts: dict[int, list[int]] = {}
    for rank in sorted(wfg.deadlocked):
        parts.setdefault(root(rank), []).append(rank)
    return sorted(parts.values())


def _deadlock_part(
    graph: ExecutionGraph,
    wfg: WaitForGraph,
    members: list[int],
    cycle: tuple[int, ...],
    senders: Senders,
) -> list[Finding]:
    """The findings of one independent part of the deadlock set (``members``, with its
    shortest ``cycle``, empty if none; ``senders``: :func:`_blocked_senders` of
    ``wfg``)."""
    findings: list[Finding] = []
    if cycle:
        ops = [_stuck_op(wfg.nodes[r]) for r in cycle]
        notes = [
            n
            for r in cycle
            for c in wfg.nodes[r].clauses
            if (n := _clause_note(graph, wfg, c, senders)) is not None
        ]
        # a helper thread that died on a rank of the part: what it was to do never comes
        notes[:0] = [d for r in sorted(members) for d in thread_deaths(graph, r)]
        also = _misdirected(wfg, cycle, members)
        refs = [op_ref(o) for o in ops]  # each op's ref built once (where() builds one)
        parts = [
            f"rank {o.rank} is blocked in {phrase(o)} ({ref.where})"
            for o, ref in zip(ops, refs, strict=True)
        ]
        head = (
            f"{rank_list(cycle).capitalize()} wait on each other forever"
            if len(cycle) > 1
            else f"Rank {cycle[0]} waits on itself forever"
        )
        stores = [o for o in ops if o.kind == "store"]
        if stores:
            # "Rank 0 waits in store.get('k') (x.py:3) for a key no other rank will set:
            # rank 1 is blocked in all_reduce #0 on group 0 (x.py:5)"
            first = stores[0]
            head = (
                f"Rank {first.rank} waits in {phrase(first)} ({where(first)}) for "
                f"{_store_keys_text(first)} no other rank will set"
            )
            parts = [_blocked_text(o) for o in ops if o is not first]
        on_cycle = set(cycle)
        extra = [r for r in members if r not in on_cycle]
        tail = (
            f"; {rank_list(extra)} wait{'s' if len(extra) == 1 else ''} on this cycle too"
            if extra
            else ""
        )
        tail += f"; {also[0]}" if also else ""
        message = f"{head}: " + "; ".join(parts) + (f" ({notes[0]})" if notes else "") + tail + "."
        hint = _hint(ops, notes, graph)
        ended = sorted({g for r in cycle for g in wfg.waits_on_exited(r)})
        if ended and any(o.op == "recv" and o.peer is None for o in ops):
            # a wildcard on the cycle was to be released by a rank that ended instead
            hint = (
                f"The receive from any rank on the cycle was to be met by {rank_list(ended)}, "
                f"which ended first (see the orphaned wait): make every rank send what the "
                f"others wait for before it exits (same number of steps, no early return)."
            )
        findings.append(
            Finding(
                kind=FindingKind.DEADLOCK,
                ranks=tuple(members),
                ops=tuple(refs),
                message=message,
                hint=hint,
                cycle=cycle,
                group=ops[0].gid if len({o.gid for o in ops}) == 1 and not stores else None,
            )
        )
    for rank in members:
        node = wfg.nodes[rank]
        if any(c.reason == "store" for c in node.clauses):
            # Any other rank may set the keys: one that ended is not waited on alone.
            if not cycle:
                findings.append(_store_finding(wfg, node))
            continue
        gone = wfg.waits_on_exited(rank)
        if not gone:
            continue
        op = next(c.op for c in node.clauses if set(c.targets) & set(gone))
        states = _gone_states(graph, wfg, gone)
        message = (
            f"Rank {rank} is blocked in {phrase(op)} ({where(op)}) waiting on "
            f"{rank_list(gone)}, which will never take part: {states}."
        )
        hint = _orphan_hint(graph, wfg, gone, op)
        findings.append(
            Finding(
                kind=FindingKind.ORPHANED_WAIT,
                ranks=tuple(sorted({rank, *gone})),
                ops=(op_ref(op),),
                message=message,
                hint=hint,
                group=op.gid,
            )
        )
    if not cycle and not any(
        f.kind in (FindingKind.ORPHANED_WAIT, FindingKind.DEADLOCK) for f in findings
    ):
        ops = [_stuck_op(wfg.nodes[r]) for r in members]
        notes = [
            n
            for r in members[:_NOTED_RANKS]
            for c in wfg.nodes[r].clauses
            if (n := _clause_note(graph, wfg, c, senders)) is not None
        ]
        why = f": {'; '.join(notes[:3])}" if notes else ""
        findings.append(
            Finding(
                kind=FindingKind.DEADLOCK,
                ranks=tuple(members),
                ops=tuple(op_ref(o) for o in ops),
                message=f"{rank_list(members).capitalize()} can never be released{why}.",
                hint=_hint(ops, notes, graph),
            )
        )
    return findings


#: what torch and gloo say when a call ran past its timeout (gloo: "Timed out waiting
#: 5000ms for recv operation to complete"; a Work's wait(timeout))
TIMEOUT_ERRORS = ("timed out", "timeout", "timing out")


#: errors that say "timed out" but mean the peer is gone: gloo's lazy connect to an
#: exited rank retries until its timeout, then reports the refused connection
_GONE_NOT_TIMEOUT = ("connection refused",)


def timed_out(op: Op) -> bool:
    """The op raised on its timeout (not on a connection its exited peer refused)."""
    lowered = (op.error or "").lower()
    return (
        not op.completed
        and any(text in lowered for text in TIMEOUT_ERRORS)
        and not any(text in lowered for text in _GONE_NOT_TIMEOUT)
    )


def _waited_on(graph: ExecutionGraph, op: Op) -> Clause | None:
    """What ``op`` waited for in the final state (ranks that never issued its match),
    or None (matched, or a mismatch).  An op that timed out although every rank issued
    its match waited on those whose match failed on the connection it closed: they
    issued it only after the timeout (a late rank that reached the call at last)."""
    clause = clause_for(graph, op)
    if clause is not None and clause.reason != "mismatch" and clause.targets:
        return clause
    if clause is None and timed_out(op):
        late = late_matches(graph, op)
        if late:
            return Clause(op, tuple(sorted(m.rank for m in late)), False, "late")
    return None


def late_matches(graph: ExecutionGraph, op: Op) -> list[Op]:
    """The other ranks' matches of ``op`` (its collective slot, or its P2P partner) that
    raised on a closed connection rather than on a timeout of their own: issued after
    ``op`` timed out and closed it."""
    if op.kind == "p2p":
        partner = graph.p2p_partner.get(op_key(op))
        matches = [partner] if partner is not None else []
    else:
        slot = graph.slot_of(op)
        matches = sorted(slot.ops.values(), key=lambda m: m.rank) if slot is not None else []
    return [m for m in matches if m.rank != op.rank and _peer_failed(m) and not timed_out(m)]


def _first_failed_waits(
    graph: ExecutionGraph, broke: Callable[[Op], bool]
) -> dict[int, tuple[Op, Clause]]:
    """Per rank, its first op that failed as ``broke(op)`` says, with what it waited for
    (a rank whose first such op waited on nobody is left out)."""
    found: dict[int, tuple[Op, Clause]] = {}
    for rank in sorted(graph.timelines):
        for op in graph.failed_ops(rank):
            if broke(op):
                clause = _waited_on(graph, op)
                if clause is not None:
                    found[rank] = (op, clause)
                break
    return found


def timed_out_waits(graph: ExecutionGraph) -> dict[int, tuple[Op, Clause]]:
    """Per rank, its first op that raised on its timeout while waiting on others, with
    what it waited for (its clause in the final state)."""
    return _first_failed_waits(graph, timed_out)


def _peer_failed(op: Op) -> bool:
    """The op raised on its timeout or on a peer's closed connection."""
    lowered = (op.error or "").lower()
    return not op.completed and any(text in lowered for text in _PEER_ERRORS)


def broken_waits(graph: ExecutionGraph, wfg: WaitForGraph) -> dict[int, tuple[Op, Clause]]:
    """Per rank, the wait the job's end broke, with what it waited for: its first op that
    raised on its timeout or on a peer's closed connection, or, for a rank killed by a
    signal from outside or ended from another of its threads (``os._exit`` from a
    watchdog thread: no end record, its main thread still inside the call), the call it
    was blocked in."""
    found = _first_failed_waits(graph, _peer_failed)
    for rank, timeline in graph.timelines.items():
        blocked = timeline.blocked
        if rank in found or blocked is None:
            continue
        status = wfg.status(rank)
        vanished = status.gone and timeline.ended is None
        if status is not RankStatus.KILLED and not vanished:
            continue
        for op in blocked.ops:
            clause = _waited_on(graph, op)
            if clause is not None:
                found[rank] = (op, clause)
                break
    return found


def timed_out_deadlock(waits: dict[int, tuple[Op, Clause]]) -> frozenset[int]:
    """The ranks whose timed-out ops could never have completed: the graph reduction
    (:func:`~dl2.model.stuck.deadlock_set`) of their clauses, every rank outside them
    counted as able to progress.  A deadlock that the timeouts broke."""
    outside = {t for _, clause in waits.values() for t in clause.targets} - waits.keys()
    return deadlock_set({r: (clause,) for r, (_, clause) in waits.items()}, outside)


def cycle_order(waits: Mapping[int, Sequence[int]]) -> tuple[tuple[int, ...], list[int]]:
    """The shortest wait cycle among ``waits`` (rank -> the ranks it waits on), and the
    ranks to show: the cycle's, else all of them ascending."""
    cycle = shortest_cycle(waits)
    return cycle, list(cycle) if cycle else sorted(waits)


def waiting_parts(ops: Sequence[Op], limit: int) -> list[str]:
    """``rank 0 in recv from rank 1 (train.py:7)`` for the first ``limit`` ops, then
    how many more."""
    parts = [f"rank {o.rank} in {phrase(o)} ({where(o)})" for o in ops[:limit]]
    if len(ops) > limit:
        parts.append(f"{len(ops) - limit} more")
    return parts


def timed_out_deadlock_findings(graph: ExecutionGraph, wfg: WaitForGraph) -> list[Finding]:
    """A deadlock the job's end broke: ranks whose calls raised on their timeout (or on
    the closed connection of a peer whose own call had) or were killed from outside
    inside them, while each waited only on others of them (recv/recv, crossed
    collectives), read from the traces after the fact (``--on-deadlock wait``, a job
    whose threads kept dl2 from proving it live, ``dl2 analyze``)."""
    waits = broken_waits(graph, wfg)
    members = timed_out_deadlock(waits)
    if not members:
        return []
    cycle, shown = cycle_order({r: waits[r][1].targets for r in members})
    ops = [waits[r][0] for r in shown]
    parts = waiting_parts(ops, 4)
    if all(timed_out(waits[r][0]) for r in members):
        ended = "until their timeouts ended the job"
    else:
        killed = [r for r in sorted(members) if wfg.status(r) is RankStatus.KILLED]
        how = f" ({rank_list(killed)} killed by a signal)" if killed else ""
        vanished = [
            r
            for r in sorted(members)
            if r not in killed
            and wfg.status(r).gone
            and graph.timelines[r].ended is None
            and not waits[r][0].error
        ]
        if vanished:
            calls = "its call" if len(vanished) == 1 else "their calls"
            how += (
                f" ({rank_list(vanished)} ended inside {calls}, from another thread or "
                "outside Python: os._exit, a C-level exit)"
            )
        ended = f"until the job's end broke the cycle{how}"
    error = next((o.error for o in ops if o.error), None)
    return [
        Finding(
            kind=FindingKind.DEADLOCK,
            ranks=tuple(sorted(members)),
            ops=tuple(op_ref(o) for o in ops),
            message=(
                f"{rank_list(sorted(members)).capitalize()} waited on each other {ended}: "
                f"{'; '.join(parts)}." + (f" {error}" if error else "")
            ),
            hint=_hint(ops, [], graph),
            cycle=cycle,
            group=ops[0].gid if len({o.gid for o in ops}) == 1 else None,
        )
    ]


def failed_op_findings(graph: ExecutionGraph, wfg: WaitForGraph) -> list[Finding]:
    """Ops that raised because a rank they needed had exited (gloo: "Connection closed").

    gloo notices a peer's exit and fails the pending op instead of hanging; the root
    cause is still the peer that left without taking part.  Ops that timed out in a
    deadlock the timeouts broke are the deadlock's (:func:`timed_out_deadlock_findings`).
    """
    findings: list[Finding] = []
    in_timed_out_deadlock = timed_out_deadlock(broken_waits(graph, wfg))
    for rank in sorted(graph.timelines):
        if rank in wfg.deadlocked or rank in in_timed_out_deadlock:
            continue
        for op in graph.failed_ops(rank):
            if op.completed:
                continue
            clause = clause_for(graph, op)
            if clause is None or clause.reason == "mismatch":
                # a mismatched collective: its peers failed on the mismatch itself (gloo
                # aborts on a size it did not expect); the mismatch finding says it
                continue
            gone = [t for t in clause.targets if wfg.status(t).gone]
            if timed_out(op):  # those alive at the timeout were ended after it: a hang
                gone = [t for t in gone if not silently_gone(graph, t)]
            if not gone:
                continue
            states = _gone_states(graph, wfg, gone)
            findings.append(
                Finding(
                    kind=FindingKind.ORPHANED_WAIT,
                    ranks=tuple(sorted({rank, *gone})),
                    ops=(op_ref(op),),
                    message=(
                        f"Rank {rank}'s {phrase(op)} ({where(op)}) failed because "
                        f"{rank_list(gone)} will never take part ({states}); "
                        f"rank {rank}'s own error: {op.error}"
                    ),
                    hint=_orphan_hint(graph, wfg, gone, op),
                    group=op.gid,
                )
            )
            break
    return findings


def _orphan_hint(graph: ExecutionGraph, wfg: WaitForGraph, gone: Sequence[int], op: Op) -> str:
    """The fix of waits orphaned by ``gone``: a kill's, the error that ended one of them
    (an exception of its own, not a peer's closed connection), or an early exit's."""
    if all(wfg.status(r) is RankStatus.KILLED for r in gone):
        return KILLED_HINT
    for rank in gone:
        cause = exit_cause(graph, rank)
        if cause is not None and not any(text in cause.lower() for text in _PEER_ERRORS):
            return (
                f"Rank {rank}'s program ended on an error of its own ({cause}): fix that "
                "first; the waits it left are its consequences."
            )
    return _ORPHAN_HINT + _ddp_hint(op)


def silently_gone(graph: ExecutionGraph, rank: int) -> bool:
    """A rank whose process went without a trace of why: no ``end`` record, no call of
    its own that failed.  A call that raised on its timeout while waiting on it found
    it alive (a dead peer closes the connection: the call fails on that instead), so it
    was ended after the timeout, by the launcher that saw a rank fail (``mp.spawn``,
    torchrun): the job hung until then."""
    timeline = graph.timelines.get(rank)
    return timeline is not None and timeline.ended is None and not graph.failed_ops(rank)


#: errors of a call that come from its peers or from waiting, not from the call itself
_PEER_ERRORS = (
    "connection closed",
    "connection reset",
    "connection refused",
    "broken pipe",
    "read error",
    "write error",
    *TIMEOUT_ERRORS,
)


def failed_call_findings(graph: ExecutionGraph) -> list[Finding]:
    """Communication calls that raised an error of their own (not a peer's exit, not a
    timeout): the first of each rank.  Called when ranks failed and no other finding
    explains it."""
    findings: list[Finding] = []
    for rank in sorted(graph.timelines):
        for op in graph.failed_ops(rank):
            error = op.error or ""
            lowered = error.lower()
            if any(text in lowered for text in _PEER_ERRORS):
                continue
            findings.append(
                Finding(
                    kind=FindingKind.FAILED_CALL,
                    ranks=(rank,),
                    ops=(op_ref(op),),
                    message=f"Rank {rank}'s {phrase(op)} ({where(op)}) raised {error}",
                    hint=(
                        "The call itself was rejected on that rank: check its arguments (peer, "
                        "tag, group, tensor shape, dtype, device) against what torch.distributed "
                        "and the backend accept; its peers then fail or wait on it."
                    ),
                    group=op.gid,
                )
            )
            break
    return findings


#: frames of a hang suspect's stack quoted in its finding
SUSPECT_FRAMES = 4
#: what a watchdog ``state``'s "where" says of a rank outside recorded communication
WHERE_TEXT = {
    "python": "running Python code",
    "backward": "inside backward()",
    "comm": "inside a communication call dl2 did not record",
}


def suspect_stack(graph: ExecutionGraph, rank: int) -> tuple[Frame, ...]:
    """The rank's user frames (innermost first) from its watchdog's last ``state``."""
    timeline = graph.timelines.get(rank)
    state = timeline.last_state if timeline else None
    return state.stack if state else ()


def suspect_where(graph: ExecutionGraph, rank: int) -> str | None:
    """Where the watchdog last saw the rank: "python", "backward", "comm" or None."""
    timeline = graph.timelines.get(rank)
    state = timeline.last_state if timeline else None
    return state.where if state and state.where else None


def _frame_text(frame: Frame) -> str:
    return f"{frame.file}:{frame.line} in {frame.function}"


def hang_suspect_findings(
    graph: ExecutionGraph,
    wfg: WaitForGraph,
    quiet: Mapping[int, float],
    suspect_after: float,
) -> list[Finding]:
    """Running ranks that blocked ranks wait on and that have been quiet for long.

    Such a rank is outside communication (computing, in I/O, waiting on a lock): the
    ranks waiting on it are released when it comes back, so it is reported as a
    *suspect* with its current stack (from the recorder's watchdog), never as a
    deadlock.
    """
    findings: list[Finding] = []
    waited_on: dict[int, list[int]] = {}
    for rank, node in wfg.waiting.items():  # the only nodes with targets
        if rank in wfg.deadlocked:
            continue
        for target in node.targets:
            waited_on.setdefault(target, []).append(rank)
    for rank in sorted(waited_on):
        if wfg.status(rank) is not RankStatus.RUNNING or quiet.get(rank, 0.0) < suspect_after:
            continue
        stack = suspect_stack(graph, rank)
        location = f" at {stack[0].file}:{stack[0].line} (in {stack[0].function})" if stack else ""
        state = WHERE_TEXT.get(suspect_where(graph, rank) or "", "outside communication")
        calls = ""
        if len(stack) > 1:
            calls = "; called from " + " <- ".join(_frame_text(f) for f in stack[1:SUSPECT_FRAMES])
            if len(stack) > SUSPECT_FRAMES:
                calls += " <- ..."
        waiters = waited_on[rank]
        waits = "; ".join(
            f"rank {w} in {phrase(_stuck_op(wfg.nodes[w]))} ({where(_stuck_op(wfg.nodes[w]))})"
            for w in waiters[:3]
        )
        findings.append(
            Finding(
                kind=FindingKind.HANG_SUSPECT,
                ranks=(rank,),
                ops=tuple(op_ref(wfg.nodes[w].clauses[0].op) for w in waiters),
                message=(
                    f"Rank {rank} has made no communication progress for "
                    f"{quiet[rank]:.0f} s{location}{calls} while {rank_list(waiters)} "
                    f"wait{'s' if len(waiters) == 1 else ''} on it ({waits}); it is {state}, "
                    "so this is not a deadlock: the waiting ranks go on when it comes back."
                ),
                hint=(
                    f"Look at what rank {rank} is doing at that line; it may be slow (long "
                    "compute, I/O) or stuck outside communication (a lock, an input queue)."
                ),
            )
        )
    return findings


def busy_poll_findings(graph: ExecutionGraph, wfg: WaitForGraph) -> list[Finding]:
    """Ranks spinning in a loop on ``is_completed()`` of works that stay pending.

    The watchdog saw the rank poll the same pending works for a while with nothing
    else recorded.  A polled send or receive whose partner is there will still never
    report completion: gloo completes point-to-point works only inside ``wait()``.  A
    polled op still missing its partner waits on that peer.  The ranks blocked on the
    spinning rank are named with it.
    """
    findings: list[Finding] = []
    for rank, node in wfg.waiting.items():
        if node.status is not RankStatus.SPINNING or node.blocked is None:
            continue
        polled = list(node.blocked.ops)
        poll_frame = report_frame(suspect_stack(graph, rank))
        unmet = {c.op.id: c for c in node.clauses}
        reasons = []
        matched: list[Op] = []
        partners: list[Op] = []
        for op in polled:
            clause = unmet.get(op.id)
            partner = graph.p2p_partner.get(op_key(op))
            if clause is not None:
                reasons.append(
                    f"{phrase(op)} ({where(op)}) still waits on {rank_list(list(clause.targets))}"
                )
            elif op.kind == "p2p" and partner is not None:
                matched.append(op)
                partners.append(partner)
            else:
                reasons.append(f"{phrase(op)} ({where(op)}) has not completed")
        if matched:
            reasons.insert(
                0,
                f"{' and '.join(phrase(o) for o in matched)} ({where(matched[0])}) "
                f"{'are' if len(matched) > 1 else 'is'} matched by "
                + " and ".join(f"rank {p.rank}'s {p.op} ({where(p)})" for p in partners)
                + ", yet gloo reports a send/recv work complete only once wait() is called "
                "on it, so is_completed() stays False",
            )
        waiters = sorted(r for r, n in wfg.waiting.items() if r != rank and rank in n.targets)
        waits = "; ".join(
            f"rank {w} in {phrase(_stuck_op(wfg.nodes[w]))} ({where(_stuck_op(wfg.nodes[w]))})"
            for w in waiters[:3]
        )
        poll_ref = replace(
            op_ref(polled[0]),
            api="is_completed",
            file=poll_frame.file if poll_frame else None,
            line=poll_frame.line if poll_frame else None,
            function=poll_frame.function if poll_frame else None,
        )
        at = f" at {poll_frame.file.rsplit('/', 1)[-1]}:{poll_frame.line}" if poll_frame else ""
        findings.append(
            Finding(
                kind=FindingKind.BUSY_POLL,
                ranks=tuple(sorted({rank, *waiters})),
                ops=(
                    poll_ref,
                    *(op_ref(p) for p in partners),
                    *(op_ref(_stuck_op(wfg.nodes[w])) for w in waiters),
                ),
                message=(
                    f"Rank {rank} spins polling is_completed(){at} on "
                    f"{len(polled)} pending work{'s' if len(polled) != 1 else ''}: "
                    + "; ".join(reasons)
                    + "."
                    + (
                        f" Meanwhile {waits} wait{'s' if len(waiters) == 1 else ''} on rank {rank}."
                        if waiters
                        else ""
                    )
                ),
                hint=(
                    "Do not busy-wait on is_completed() for send/recv works: call wait() on "
                    "them (in the order you need, or on all of them), or exchange a flag with "
                    "a collective first if the order must depend on arrival."
                ),
            )
        )
    return findings
