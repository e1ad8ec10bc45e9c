"""The stuck-rank core of ``dl2.model``: statuses, the stall test, graph reduction with its
AND/OR rule, the shortest wait cycle, the P2P channel key, the world and wait placement."""

from __future__ import annotations

import json

import pytest

from dl2.analysis import analyze
from dl2.model.execution_graph import build_execution_graph
from dl2.model.execution_graph import op_key
from dl2.model.ops import Op
from dl2.model.program import WILD
from dl2.model.program import channel_of
from dl2.model.program import mailbox
from dl2.model.program import wait_position
from dl2.model.program import world_ranks
from dl2.model.stuck import RankStatus
from dl2.model.stuck import Wait
from dl2.model.stuck import deadlock_set
from dl2.model.stuck import shortest_cycle
from dl2.model.stuck import stall_kind
from dl2.model.wait_for import WaitForGraph
from dl2.model.wait_for import build_wait_for_graph
from dl2.report import FindingKind
from dl2.report import Verdict
from trace_builders import RankBuilder
from trace_builders import ranks
from trace_builders import session


def wait_for(builders: list[RankBuilder]) -> WaitForGraph:
    s = session(builders)
    return build_wait_for_graph(s, build_execution_graph(s))


def send_send_cycle(a: RankBuilder, b: RankBuilder) -> None:
    """``a`` and ``b`` both stuck sending to each other first: a deadlock of their own."""
    a.call("send", 30, peer=b.rank, complete=False)
    b.call("send", 40, peer=a.rank, complete=False)


# -- the AND/OR rule on traces ------------------------------------------------------------------


def test_a_collective_waiting_on_a_running_rank_and_a_deadlocked_rank_is_deadlocked() -> None:
    # GIVEN rank 0 in an all_reduce of the world that ranks 1, 2 and 3 have not joined:
    # ranks 1 and 2 deadlock each other in their sends, rank 3 is running
    r0, r1, r2, r3 = ranks(4)
    r0.call("all_reduce", 10, complete=False)
    send_send_cycle(r1, r2)
    wfg = wait_for([r0, r1, r2, r3])
    assert wfg.status(3) is RankStatus.RUNNING
    (clause,) = wfg.nodes[0].clauses
    assert clause.targets == (1, 2, 3) and not clause.any_of
    # THEN rank 0 is deadlocked too: the collective needs ALL members, and rank 3's
    # progress cannot bring ranks 1 and 2 into it
    assert wfg.deadlocked == {0, 1, 2}
    assert wfg.shortest_cycle() == (1, 2)
    report = analyze(session([r0, r1, r2, r3]))
    assert report.verdict is Verdict.DEADLOCK
    (finding,) = [f for f in report.findings if f.kind is FindingKind.DEADLOCK]
    assert finding.ranks == (0, 1, 2)
    assert "rank 0 waits on this cycle too" in finding.message


def test_a_collective_waiting_only_on_running_ranks_is_released() -> None:
    # GIVEN the same all_reduce, but every missing member is running
    r0, r1, r2 = ranks(3)
    r0.call("all_reduce", 10, complete=False)
    wfg = wait_for([r0, r1, r2])
    # THEN nothing is deadlocked: rank 0 is blocked, but the others may still join
    assert wfg.status(0) is RankStatus.BLOCKED
    assert not wfg.deadlocked


def test_a_mismatched_collective_waiting_on_a_running_rank_and_a_deadlocked_rank() -> None:
    # GIVEN ranks 0 and 3 in different collectives at the same position of the world
    # group (a mismatch: rank 0 waits on every other member), ranks 1 and 2 deadlocked
    r0, r1, r2, r3 = ranks(4)
    r0.call("all_reduce", 10, complete=False)
    r3.call("broadcast", 11, root=0)
    send_send_cycle(r1, r2)
    wfg = wait_for([r0, r1, r2, r3])
    (clause,) = wfg.nodes[0].clauses
    assert clause.reason == "mismatch" and not clause.any_of
    # THEN rank 0 cannot be released by rank 3 alone
    assert wfg.deadlocked == {0, 1, 2}


def test_a_group_creation_waiting_on_a_running_rank_and_a_deadlocked_rank() -> None:
    # GIVEN rank 0 creating group [0,1,2,3], which ranks 1, 2 (deadlocked) and 3 (running)
    # have not created yet
    r0, r1, r2, r3 = ranks(4)
    r0.create_group("1", [0, 1, 2, 3], complete=False)
    send_send_cycle(r1, r2)
    wfg = wait_for([r0, r1, r2, r3])
    (clause,) = wfg.nodes[0].clauses
    assert clause.reason == "group" and clause.targets == (1, 2, 3) and not clause.any_of
    assert wfg.deadlocked == {0, 1, 2}


def test_a_wildcard_receive_is_released_by_any_sender_that_can_progress() -> None:
    # GIVEN rank 0 in a recv from any rank: ranks 1 and 2 deadlock each other, rank 3 runs
    r0, r1, r2, r3 = ranks(4)
    r0.call("recv", 10, peer=None, complete=False)
    send_send_cycle(r1, r2)
    wfg = wait_for([r0, r1, r2, r3])
    (clause,) = wfg.nodes[0].clauses
    assert clause.any_of and clause.targets == (1, 2, 3)
    # THEN rank 3 may still send to it: rank 0 is not deadlocked
    assert wfg.deadlocked == {1, 2}


def test_a_wildcard_receive_whose_every_sender_is_stuck_is_deadlocked() -> None:
    # GIVEN rank 0 in a recv from any rank, and every other rank deadlocked or gone
    r0, r1, r2, r3 = ranks(4)
    r0.call("recv", 10, peer=None, complete=False)
    send_send_cycle(r1, r2)
    r3.end()
    wfg = wait_for([r0, r1, r2, r3])
    assert wfg.status(3) is RankStatus.EXITED
    assert wfg.deadlocked == {0, 1, 2}
    assert wfg.waits_on_exited(0) == (3,)


# -- graph reduction itself --------------------------------------------------------------------


def test_reduction_and_clause_needs_every_target() -> None:
    waiting = {0: [Wait((1, 2))], 1: [Wait((2,))], 2: [Wait((1,))]}
    assert deadlock_set(waiting, free={3}) == {0, 1, 2}
    assert deadlock_set({0: [Wait((1, 3))]}, free={1}) == {0}
    assert deadlock_set({0: [Wait((1, 3))]}, free={1, 3}) == frozenset()


def test_reduction_or_clause_needs_one_target() -> None:
    waiting = {0: [Wait((1, 3), any_of=True)], 1: [Wait((2,))], 2: [Wait((1,))]}
    assert deadlock_set(waiting, free={3}) == {1, 2}
    assert deadlock_set(waiting, free=()) == {0, 1, 2}


def test_reduction_every_clause_must_be_met() -> None:
    waiting = {0: [Wait((1,)), Wait((2, 3), any_of=True)]}
    assert deadlock_set(waiting, free={1}) == {0}
    assert deadlock_set(waiting, free={1, 3}) == frozenset()


def test_reduction_empty_clauses() -> None:
    # an AND clause without targets is met, an OR clause without targets never is
    assert deadlock_set({0: [Wait(())]}, free=()) == frozenset()
    assert deadlock_set({0: [Wait((), any_of=True)]}, free={1}) == {0}
    assert deadlock_set({0: []}, free=()) == frozenset()


def test_reduction_releases_chains_in_any_order() -> None:
    # rank r waits on rank r+1; the last one waits on a free rank
    chain = {r: [Wait((r + 1,))] for r in range(50)}
    assert deadlock_set(chain, free={50}) == frozenset()
    reversed_chain = dict(reversed(list(chain.items())))
    assert deadlock_set(reversed_chain, free={50}) == frozenset()
    assert deadlock_set(chain, free=()) == frozenset(range(50))


def test_reduction_waiting_rank_listed_free_counts_as_free() -> None:
    waiting = {0: [Wait((1,))], 1: [Wait((0,))]}
    assert deadlock_set(waiting, free={1}) == frozenset()


def test_reduction_self_wait_and_repeated_targets() -> None:
    assert deadlock_set({0: [Wait((0,))]}, free={1}) == {0}
    assert deadlock_set({0: [Wait((1, 1, 2))]}, free={1, 2}) == frozenset()
    assert deadlock_set({0: [Wait((1, 1), any_of=True)]}, free=()) == {0}


# -- the shortest cycle -------------------------------------------------------------------------


def test_shortest_cycle_none_and_self() -> None:
    assert shortest_cycle({}) == ()
    assert shortest_cycle({0: [1], 1: [2], 2: []}) == ()
    assert shortest_cycle({0: [1], 1: [1]}) == (1,)


def test_shortest_cycle_prefers_the_shorter_cycle_from_the_lowest_rank() -> None:
    # a 3-cycle through rank 0 and a 2-cycle between ranks 4 and 5
    waits = {0: [1], 1: [2], 2: [0], 4: [5], 5: [4]}
    assert shortest_cycle(waits) == (4, 5)
    # the recv ring of three ranks: each waits on its predecessor
    assert shortest_cycle({0: [2], 1: [0], 2: [1]}) == (0, 2, 1)


def test_shortest_cycle_breaks_ties_by_rank_order() -> None:
    # two cycles of three through rank 0: 0-1-3 and 0-2-3
    waits = {0: [2, 1], 1: [3], 2: [3], 3: [0]}
    assert shortest_cycle(waits) == (0, 1, 3)
    # equal cycles not through the lowest rank start at their own lowest rank
    assert shortest_cycle({0: [3], 2: [3], 3: [2]}) == (2, 3)


def test_shortest_cycle_ignores_targets_outside_the_relation() -> None:
    assert shortest_cycle({0: [1, 7], 1: [0, 9]}) == (0, 1)
    assert shortest_cycle({0: [7], 7: [0]}) == (0, 7)
    assert shortest_cycle({0: [7]}) == ()


def test_wait_for_cycle_stays_inside_the_deadlock_set() -> None:
    # GIVEN ranks 0 and 1 deadlocked, and rank 2 blocked on rank 0 (deadlocked too,
    # but no cycle runs through it)
    r0, r1, r2 = ranks(3)
    send_send_cycle(r0, r1)
    r2.call("recv", 10, peer=0, complete=False)
    wfg = wait_for([r0, r1, r2])
    assert wfg.deadlocked == {0, 1, 2}
    assert wfg.shortest_cycle() == (0, 1)


# -- the P2P channel key ------------------------------------------------------------------------


def op(name: str, rank: int = 0, **fields: object) -> Op:
    return Op(rank=rank, id=1, op=name, gid=str(fields.pop("gid", "0")), index=0, **fields)


def test_channel_of_sends_and_receives() -> None:
    assert channel_of(op("send", rank=0, peer=1, tag=3)) == ("0", 0, 1, 3)
    assert channel_of(op("recv", rank=1, peer=0, tag=3)) == ("0", 0, 1, 3)
    # a missing tag is torch's default
    assert channel_of(op("send", rank=0, peer=1)) == ("0", 0, 1, 0)
    assert channel_of(op("recv", rank=2, peer=None, gid="5")) == ("5", WILD, 2, 0)
    # a wildcard receive known to have matched a sender is on that sender's channel
    assert channel_of(op("recv", rank=2, peer=None), sender=1) == ("0", 1, 2, 0)
    assert channel_of(op("recv", rank=2, peer=3), sender=1) == ("0", 3, 2, 0)
    assert channel_of(op("all_reduce")) is None
    assert channel_of(op("send", peer=None)) is None
    assert mailbox(("0", 1, 2, 7)) == ("0", 2, 7)


def test_p2p_matching_follows_the_channel_in_order() -> None:
    # GIVEN two sends on tag 0 (one recorded without its tag), one on tag 1, and the
    # receives posted tag 1 first
    r0, r1 = ranks(2)
    first = r0.issue("send", 10, peer=1, **{"async": True})
    second = r0.issue("send", 11, peer=1, tag=0, **{"async": True})
    tagged = r0.issue("send", 12, peer=1, tag=1, **{"async": True})
    recv_tagged = r1.issue("recv", 20, peer=0, tag=1, **{"async": True})
    recv_a = r1.issue("recv", 21, peer=0, tag=0, **{"async": True})
    recv_b = r1.issue("recv", 22, peer=0, **{"async": True})
    graph = build_execution_graph(session([r0, r1]))
    partner = {k[1]: o.id for k, o in graph.p2p_partner.items() if k[0] == 0}
    # THEN each channel pairs its sends and receives in order; tags never mix
    assert partner == {first: recv_a, second: recv_b, tagged: recv_tagged}


def test_a_pending_wildcard_meets_the_earliest_unmatched_send() -> None:
    r0, r1, r2 = ranks(3)
    r1.call("recv", 5, peer=2)  # rank 1 is busy first
    late = r1.issue("send", 10, peer=0, **{"async": True})
    early = r2.issue("send", 20, peer=0, **{"async": True})
    wildcard = r0.issue("recv", 30, peer=None, **{"async": True})
    r2.issue("send", 21, peer=1, **{"async": True})
    graph = build_execution_graph(session([r0, r1, r2]))
    match = graph.p2p_partner[(0, wildcard)]
    assert (match.rank, match.id) == (2, early)
    assert (1, late) not in {op_key(o) for o in graph.p2p_partner.values()}


# -- the world and where ranks block -------------------------------------------------------------


def test_world_ranks() -> None:
    assert world_ranks(4, [0, 1]) == range(4)
    assert world_ranks(2, [0, 3]) == range(4)  # a trace from a rank past the header's world
    assert world_ranks(0, []) == range(0)


def test_the_wait_for_graph_covers_every_rank_of_the_world() -> None:
    # GIVEN traces of ranks 0 and 3 whose headers disagree on the world's size (2, 4)
    r0, r3 = RankBuilder(0, 2), RankBuilder(3, 4)
    r0.call("recv", 10, peer=3, complete=False)
    wfg = wait_for([r0, r3])
    assert sorted(wfg.nodes) == [0, 1, 2, 3]
    assert wfg.status(1) is RankStatus.NO_TRACE and wfg.status(3) is RankStatus.RUNNING


def test_wait_position() -> None:
    r0, r1 = ranks(2)
    isend = r0.issue("send", 10, peer=1, **{"async": True})
    blocking = r0.call("all_reduce", 11)
    never = r0.issue("send", 12, peer=1, **{"async": True})
    r0.wait(isend)
    r0.call("barrier", 13)
    ops = build_execution_graph(session([r0, r1])).timelines[0].by_id
    assert wait_position(ops[blocking]) == 2  # right after it is issued (ops 0 and 1)
    assert wait_position(ops[isend]) == 3  # where its wait is: after the 3 first ops
    assert wait_position(ops[never]) is None


# -- statuses and the stall test -----------------------------------------------------------------


def test_rank_status_values_are_what_reports_show() -> None:
    assert [s.value for s in RankStatus] == [
        "blocked",
        "spinning",
        "running",
        "exited",
        "failed",
        "killed",
        "no-trace",
    ]
    assert f"rank 2 {RankStatus.EXITED}" == "rank 2 exited"
    assert json.dumps({"status": RankStatus.NO_TRACE}) == '{"status": "no-trace"}'
    assert {s for s in RankStatus if s.gone} == {
        RankStatus.EXITED,
        RankStatus.FAILED,
        RankStatus.KILLED,
    }
    assert {s for s in RankStatus if s.can_progress} == {
        RankStatus.RUNNING,
        RankStatus.SPINNING,
        RankStatus.NO_TRACE,
    }


@pytest.mark.parametrize(
    ("where", "pending", "kind"),
    [
        ("backward", [3], "stall"),
        ("comm", [3, 4], "stall"),
        ("poll", [3], "poll"),
        ("python", [3], None),
        ("comm", [], None),
        ("comm", None, None),
        (None, [3], None),
    ],
)
def test_stall_kind(where: str | None, pending: list[int] | None, kind: str | None) -> None:
    assert stall_kind(where, pending) == kind


def test_a_stall_report_blocks_the_rank_on_its_pending_works() -> None:
    r0, r1 = ranks(2)
    op_id = r0.issue("all_reduce", 10, api=None, **{"async": True})
    r0.state([op_id], "comm")
    r1.state([], "comm")
    timelines = build_execution_graph(session([r0, r1])).timelines
    blocked = timelines[0].blocked
    assert blocked is not None and blocked.how == "stall"
    assert [o.id for o in blocked.ops] == [op_id]
    assert timelines[1].blocked is None


def test_components_come_after_every_component_they_reach():
    from dl2.model.stuck import strongly_connected_components

    graph = {0: [1], 1: [0, 2], 2: [3], 3: [2, 4], 4: [], 5: [0]}
    components = strongly_connected_components(graph)
    assert sorted(map(tuple, components)) == [(0, 1), (2, 3), (4,), (5,)]
    position = {rank: i for i, component in enumerate(components) for rank in component}
    for rank, targets in graph.items():
        assert all(position[t] <= position[rank] for t in targets)


def test_in_a_mismatched_collective_a_rank_waits_on_those_in_another_call() -> None:
    # GIVEN ranks 0 and 1 in barrier #0 and rank 2 in an all_reduce at the same position
    r0, r1, r2 = ranks(3)
    r0.call("barrier", 10, complete=False)
    r1.call("barrier", 10, complete=False)
    r2.call("all_reduce", 12, count=4, complete=False)
    wfg = wait_for([r0, r1, r2])
    # THEN the barrier ranks wait on rank 2, not on each other; rank 2 on both
    assert wfg.waiting[0].clauses[0].targets == (2,)
    assert wfg.waiting[1].clauses[0].targets == (2,)
    assert wfg.waiting[2].clauses[0].targets == (0, 1)
    assert wfg.deadlocked == frozenset({0, 1, 2})


class _Counted(tuple):  # type: ignore[type-arg]
    """A targets tuple that counts how often it is read whole."""

    reads = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).reads += 1
        return super().__iter__()


def _halves(world: int) -> dict[int, tuple[int, ...]]:
    """Each rank of the lower half waits on the upper half and the other way round, every
    rank of a half through the same tuple (as the ranks blocked in one collective)."""
    _Counted.reads = 0
    low, high = _Counted(range(world // 2)), _Counted(range(world // 2, world))
    return {r: (high if r < world // 2 else low) for r in range(world)}


def test_ranks_sharing_their_targets_cost_the_targets_once_not_once_per_rank() -> None:
    # GIVEN 512 ranks in two halves, each waiting on the other half through one tuple
    # (W/2 ranks times W/2 targets: 65,536 waits)
    waits = _halves(512)
    # WHEN the graph is reduced and its shortest cycle found
    dead = deadlock_set({r: [Wait(t)] for r, t in waits.items()}, free=())
    reduction_reads = _Counted.reads
    _Counted.reads = 0
    cycle = shortest_cycle(waits)
    # THEN every rank is deadlocked, the cycle is the lowest pair, and each shared tuple
    # was read a few times, not once per rank that holds it
    assert dead == frozenset(range(512))
    assert cycle == (0, 256)
    assert reduction_reads <= 2
    assert _Counted.reads <= 6


@pytest.mark.parametrize("world", [2, 3, 6, 9])
def test_shared_targets_give_what_copies_give(world: int) -> None:
    # GIVEN the halves' waits, once with shared tuples and once with a copy per rank,
    # some ranks released from outside
    shared = _halves(world)
    copies = {r: tuple(t) for r, t in shared.items()}
    for free in ((), (0,), (world - 1,), tuple(range(world // 2))):
        # THEN the reduction and the cycle do not depend on the sharing
        assert deadlock_set({r: [Wait(t)] for r, t in shared.items()}, free) == deadlock_set(
            {r: [Wait(t)] for r, t in copies.items()}, free
        )
    assert shortest_cycle(shared) == shortest_cycle(copies)
    # a rank with a second wait of its own, and an OR wait over a shared tuple
    mixed = {r: [Wait(t), Wait((r,) if r % 2 else ())] for r, t in shared.items()}
    mixed_copies = {r: [Wait(tuple(w.targets)) for w in ws] for r, ws in mixed.items()}
    assert deadlock_set(mixed, ()) == deadlock_set(mixed_copies, ())
    any_of = {r: [Wait(t, any_of=True)] for r, t in shared.items()}
    any_of_copies = {r: [Wait(tuple(t), any_of=True)] for r, t in shared.items()}
    assert deadlock_set(any_of, (0,)) == deadlock_set(any_of_copies, (0,))


def test_the_ranks_blocked_in_one_collective_share_their_targets() -> None:
    # GIVEN 8 ranks: 0-3 in all_reduce #0, 4-7 in barrier #0 of the world group (a
    # mismatch), and ranks 0-3 of another run where 4-7 never reach the all_reduce
    builders = ranks(8)
    for b in builders:
        if b.rank < 4:
            b.call("all_reduce", 10, count=4, complete=False)
        else:
            b.call("barrier", 12, complete=False)
    wfg = wait_for(builders)
    # THEN each half waits on the other through one tuple
    low = [wfg.waiting[r].clauses[0].targets for r in range(4)]
    high = [wfg.waiting[r].clauses[0].targets for r in range(4, 8)]
    assert low[0] == (4, 5, 6, 7) and high[0] == (0, 1, 2, 3)
    assert all(t is low[0] for t in low) and all(t is high[0] for t in high)
    assert wfg.nodes[1].targets is low[0]
    assert wfg.deadlocked == frozenset(range(8))
    assert wfg.shortest_cycle() == (0, 4)
    # and missing members: 4-7 never issue the all_reduce at all
    builders = ranks(8)
    for b in builders:
        if b.rank < 4:
            b.call("all_reduce", 10, count=4, complete=False)
        else:
            b.end("exit")
    waiting = wait_for(builders).waiting
    missing = [c.targets for r in range(4) for c in waiting[r].clauses]
    assert missing[0] == (4, 5, 6, 7) and all(t is missing[0] for t in missing)


def _one_name_two_groups() -> list[RankBuilder]:
    """Ranks 0 and 1 created group "1" as ranks [0, 1], ranks 2 and 3 as [2, 3] (they
    created groups in different orders), and all four are inside an all_reduce on it."""
    builders = ranks(4)
    for b in builders:
        b.create_group("1", [0, 1] if b.rank < 2 else [2, 3], line=5)
        b.call("all_reduce", 10, gid="1", count=4, complete=False)
    return builders


def test_a_group_name_given_to_different_groups_holds_its_ranks_once_the_job_ended() -> None:
    # GIVEN one name for two groups, every rank inside a collective on it, the job ended
    s = session(_one_name_two_groups())
    wfg = build_wait_for_graph(s, build_execution_graph(s))
    # THEN each rank waits on the ranks that gave the name to the other group: a deadlock
    assert wfg.waiting[0].clauses[0].reason == "group-views"
    assert wfg.waiting[0].clauses[0].targets == (2, 3)
    assert wfg.waiting[3].clauses[0].targets == (0, 1)
    assert wfg.deadlocked == frozenset(range(4))
    report = analyze(s)
    assert report.verdict is Verdict.DEADLOCK
    deadlock = next(f for f in report.findings if f.kind is FindingKind.DEADLOCK)
    assert "group 1 is not the same group on every rank" in deadlock.message
    assert "same order" in deadlock.hint


def test_a_group_name_given_to_different_groups_is_no_proof_while_the_job_runs() -> None:
    # GIVEN the same ranks while the job runs (a live monitor's view): their collectives
    # may still complete, so nothing is proven from the names alone
    s = session(_one_name_two_groups(), states={r: "alive" for r in range(4)})
    wfg = build_wait_for_graph(s, build_execution_graph(s))
    assert not wfg.deadlocked
    assert all(node.status is RankStatus.RUNNING for node in wfg.nodes.values())
