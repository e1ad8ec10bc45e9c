"""c10d store waits: a rank blocked in store.get / store.wait waits on any rank that may
still set its keys (an OR clause), and a cycle through such a wait is a deadlock."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from dl2.analysis import analyze
from dl2.model.execution_graph import build_execution_graph
from dl2.model.ops import store_key
from dl2.model.stuck import RankStatus
from dl2.model.wait_for import build_wait_for_graph
from dl2.record.store import STORE_METHODS
from dl2.render.console import ConsoleRenderer
from dl2.render.jsonreport import JsonRenderer
from dl2.report import FindingKind
from dl2.report import Verdict
from dl2.trace.session import EXITED
from trace_builders import ranks
from trace_builders import read_raw_trace
from trace_builders import session

NS = "tcp:29500|default_pg/0//"


def _get_before_collective(setter_first: bool = False):
    """Rank 0 gets 'ready' then all_reduces; rank 1 all_reduces, then sets 'ready'."""
    r0, r1 = ranks(2)
    if setter_first:
        r1.store("set", 20, ["ready"])
    r0.store("get", 12, ["ready"], complete=setter_first)
    if setter_first:
        r0.call("all_reduce", 13, complete=False)
    r1.call("all_reduce", 21, complete=False)
    return r0, r1


def test_get_of_a_key_nobody_set_waits_on_every_other_rank_or():
    # GIVEN rank 0 in store.get('ready') and rank 1 in an all_reduce rank 0 never reaches
    built = session(list(_get_before_collective()))
    graph = build_execution_graph(built)
    wfg = build_wait_for_graph(built, graph)
    # THEN rank 0's one clause is an OR over rank 1, on the store op
    (clause,) = wfg.nodes[0].clauses
    assert clause.any_of and clause.reason == "store" and clause.targets == (1,)
    assert clause.op.op == "store_get" and clause.op.kind == "store"
    assert clause.op.gid == NS and clause.op.keys == ("ready",)
    assert clause.op.frame is not None and clause.op.frame.line == 12
    # AND both ranks are in the deadlock set, on one cycle
    assert wfg.deadlocked == {0, 1}
    assert wfg.shortest_cycle() == (0, 1)


def test_store_deadlock_finding_names_the_get_and_the_collective():
    report = analyze(session(list(_get_before_collective())))
    assert report.verdict is Verdict.DEADLOCK
    first = report.findings[0]
    assert first.kind is FindingKind.DEADLOCK
    assert first.cycle == (0, 1) and first.ranks == (0, 1)
    assert [(o.rank, o.op, o.api, o.line) for o in first.ops] == [
        (0, "store_get", "get", 12),
        (1, "all_reduce", "all_reduce", 21),
    ]
    assert first.message == (
        "Rank 0 waits in store.get('ready') (train.py:12) for a key no other rank will set: "
        "rank 1 is blocked in all_reduce #0 on group 0 (train.py:21)."
    )
    assert "sets its key" in first.hint
    assert [f.kind for f in report.findings] == [FindingKind.DEADLOCK]
    # the JSON carries the store op, the console draws it as a store call
    data = json.loads(JsonRenderer().render(report))
    op = data["findings"][0]["ops"][0]
    assert (op["op"], op["api"], op["group"], op["detail"]) == ("store_get", "get", NS, "'ready'")
    text = ConsoleRenderer(color=False).render(report)
    assert "rank 0 store.get('ready') (train.py:12) ⇢ rank 1 all_reduce" in text


def test_a_key_set_before_the_get_blocks_nobody():
    # GIVEN rank 1 set 'ready' (its record is there) and rank 0 still in get('ready')
    r0, r1 = ranks(2)
    r1.store("set", 20, ["ready"])
    r0.store("get", 12, ["ready"], complete=False)
    r1.call("all_reduce", 21, complete=False)
    built = session([r0, r1])
    graph = build_execution_graph(built)
    wfg = build_wait_for_graph(built, graph)
    # THEN rank 0's get is about to return: it waits on nobody, and nothing is stuck
    assert wfg.status(0) is RankStatus.RUNNING
    assert not wfg.deadlocked
    assert graph.store_key_may_exist(store_key(NS, "ready"))
    assert analyze(built).verdict is Verdict.OK


def test_a_key_the_waiting_rank_added_itself_blocks_nobody():
    r0, r1 = ranks(2)
    r0.store("add", 11, ["ready"])
    r0.store("wait", 12, ["ready"], complete=False)
    r1.call("all_reduce", 21, complete=False)
    built = session([r0, r1])
    assert not build_wait_for_graph(built, build_execution_graph(built)).deadlocked


def test_the_correct_twin_is_ok():
    report = analyze(session(list(_get_before_collective(setter_first=True))))
    assert report.verdict is Verdict.OK and report.findings == ()


def test_a_running_rank_may_set_the_key_so_there_is_no_deadlock():
    # GIVEN rank 0 in get('ready'), rank 1 in an all_reduce of group 1 = {0, 1} that
    # waits on rank 0, and rank 2 running (it may still set the key)
    r0, r1, r2 = ranks(3)
    for r in (r0, r1, r2):
        r.create_group("1", [0, 1])
    r0.store("get", 12, ["ready"], complete=False)
    r1.call("all_reduce", 21, gid="1", complete=False)
    built = session([r0, r1, r2])
    wfg = build_wait_for_graph(built, build_execution_graph(built))
    assert wfg.nodes[0].clauses[0].targets == (1, 2)
    assert not wfg.deadlocked


def test_every_key_of_a_wait_must_be_set():
    # GIVEN rank 1 set 'a' only, rank 0 waits for ['a', 'b']
    r0, r1 = ranks(2)
    r1.store("set", 20, ["a"])
    r0.store("wait", 12, ["a", "b"], complete=False)
    r1.call("barrier", 21, complete=False)
    report = analyze(session([r0, r1]))
    assert report.verdict is Verdict.DEADLOCK
    assert report.findings[0].message.startswith(
        "Rank 0 waits in store.wait(['a', 'b']) (train.py:12) for keys no other rank will set"
    )


def test_keys_of_other_prefixes_or_stores_are_other_keys():
    r0, r1 = ranks(2)
    r1.store("set", 20, ["ready"], prefix="1/")  # another group's store
    r1.store("set", 22, ["ready"], store="tcp:29501")  # another store
    r0.store("get", 12, ["ready"], complete=False)
    r1.call("all_reduce", 21, complete=False)
    assert analyze(session([r0, r1])).verdict is Verdict.DEADLOCK


def test_a_store_dl2_cannot_tell_has_no_clause():
    # GIVEN rank 0 in get on a store of unknown identity (HashStore, unseen prefix)
    r0, r1 = ranks(2)
    r0.store("get", 12, ["ready"], store=None, prefix="", complete=False)
    r1.call("all_reduce", 21, complete=False)
    built = session([r0, r1])
    wfg = build_wait_for_graph(built, build_execution_graph(built))
    # THEN who sets its keys is unknown: rank 0 is not claimed to be stuck
    assert not wfg.deadlocked and wfg.status(0) is RankStatus.RUNNING


def test_a_wait_with_a_short_timeout_raises_rather_than_hangs():
    r0, r1 = ranks(2)
    r0.store("wait", 12, ["ready"], timeout=5.0, complete=False)
    r1.call("all_reduce", 21, complete=False)
    built = session([r0, r1])
    wfg = build_wait_for_graph(built, build_execution_graph(built))
    assert wfg.status(0) is RankStatus.BLOCKED and not wfg.deadlocked


def test_a_get_that_returned_or_raised_is_over():
    r0, r1 = ranks(2)
    r0.store("get", 12, ["ready"], err="DistStoreError: timeout")
    r0.store("get", 13, ["other"])
    r1.call("all_reduce", 21, complete=False)
    built = session([r0, r1])
    graph = build_execution_graph(built)
    assert graph.timelines[0].blocked is None
    assert graph.timelines[0].ops == ()  # store calls are no ops of the matching


def test_a_store_wait_of_another_thread_does_not_hold_the_rank():
    # GIVEN rank 0 enters wait(['stop']) (a watcher thread) and then goes on: its main
    # thread issues and completes an all_reduce; rank 1 waits in the next all_reduce
    r0, r1 = ranks(2)
    r0.store("wait", 12, ["stop"], complete=False)
    r0.call("all_reduce", 13)
    r1.call("all_reduce", 13)
    r1.call("all_reduce", 14, complete=False)
    built = session([r0, r1])
    graph = build_execution_graph(built)
    wfg = build_wait_for_graph(built, graph)
    # THEN rank 0 is not held by the store wait: it is running (it may yet reach the
    # all_reduce), and nothing is a deadlock
    assert graph.timelines[0].blocked is None
    assert wfg.status(0) is RankStatus.RUNNING and not wfg.deadlocked


def test_a_rank_inside_a_collective_is_held_by_it_not_by_a_store_wait():
    # GIVEN rank 0 inside an all_reduce, and then a watcher thread of it in wait(['stop'])
    r0, r1 = ranks(2)
    r0.call("all_reduce", 13, complete=False)
    r0.store("wait", 12, ["stop"], complete=False)
    r1.call("barrier", 14, complete=False)
    built = session([r0, r1])
    graph = build_execution_graph(built)
    # THEN the rank is blocked in the all_reduce (an AND wait on rank 1)
    blocked = graph.timelines[0].blocked
    assert blocked is not None and blocked.ops[0].op == "all_reduce"
    assert analyze(built).findings[0].ops[0].op == "all_reduce"


@pytest.mark.parametrize("where", [None, "python", "backward"])
def test_a_store_wait_holds_the_rank_once_the_watchdog_finds_it_there(where):
    # GIVEN rank 0 in wait(['stop']), with no watchdog report yet (None) or one that
    # finds its main thread elsewhere (a watcher thread waits, the rank computes)
    r0, r1 = ranks(2)
    r0.store("wait", 12, ["stop"], complete=False, where=where)
    r1.call("all_reduce", 14, complete=False)
    built = session([r0, r1])
    graph = build_execution_graph(built)
    # THEN the wait does not hold the rank (yet): no deadlock is claimed
    assert graph.timelines[0].blocked is None
    assert not build_wait_for_graph(built, graph).deadlocked


def test_a_get_whose_setter_exited_is_a_deadlock_not_an_orphaned_wait():
    # GIVEN rank 1 left cleanly without setting 'ready', rank 0 still in get('ready')
    r0, r1 = ranks(2)
    r0.store("get", 12, ["ready"], complete=False)
    r1.call("all_reduce", 21)
    r1.end()
    report = analyze(session([r0, r1], states={1: EXITED}))
    # THEN a store.get hangs until the store's timeout (it is no gloo connection): deadlock
    assert report.verdict is Verdict.DEADLOCK
    (finding,) = report.findings
    assert finding.kind is FindingKind.DEADLOCK and finding.ranks == (0, 1)
    assert finding.message == (
        "Rank 0 waits in store.get('ready') (train.py:12) for a key no other rank will set: "
        "rank 1 exited."
    )


def test_a_store_wait_off_the_cycle_is_listed_with_it():
    # GIVEN ranks 0 and 1 in a send/send cycle, rank 2 in get('go') that only they set
    r0, r1, r2 = ranks(3)
    r0.call("send", 10, peer=1, complete=False)
    r1.call("send", 20, peer=0, complete=False)
    r2.store("get", 30, ["go"], complete=False)
    report = analyze(session([r0, r1, r2]))
    assert report.verdict is Verdict.DEADLOCK
    first = report.findings[0]
    assert first.cycle == (0, 1) and first.ranks == (0, 1, 2)
    assert first.message.endswith("; rank 2 waits on this cycle too.")


def test_set_and_check_records_are_progress_not_calls():
    from dl2.live.tailer import _File

    entry = _File("rank0", None)
    (r0,) = ranks(1)
    get = r0.store("get", 3, ["k"], store="tcp:1", prefix="", complete=False, where=None)
    r0.store("set", 4, ["k"], store="tcp:1", prefix="")
    entry.feed(r0.text().encode(), 0.0, False)
    assert entry.open_calls == {get} and entry.progress == 2
    done = len(r0.text())
    r0.ret(get)
    entry.feed(r0.text()[done:].encode(), 0.0, False)
    assert entry.open_calls == set()


# -- recording, in-process ----------------------------------------------------------------


@pytest.mark.timeout(60)
def test_recorder_records_user_store_calls_and_none_of_torchs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    from dl2.record import install
    from dl2.record import uninstall

    originals = {name: getattr(dist.Store, name) for name in STORE_METHODS}
    original_init = dist.PrefixStore.__init__
    base = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=20))
    assert install(str(tmp_path))
    try:
        # torch's own store traffic: rendezvous, group creation, a barrier
        dist.init_process_group("gloo", store=base, rank=0, world_size=1)
        dist.new_group([0])
        dist.barrier()
        store = dist.distributed_c10d._get_default_store()
        store.set("ready", "1")
        assert store.get("ready") == b"1"
        mine = dist.PrefixStore("mine", dist.PrefixStore("outer", base))
        assert mine.add("n", 2) == 2
        mine.wait(["n"], timedelta(seconds=5))
        with pytest.raises(Exception, match=r"(?i)timeout|wait"):
            mine.wait(["never"], timedelta(milliseconds=50))
        assert mine.check(["n"])
        dist.HashStore().set("h", "x")
        dist.destroy_process_group()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        uninstall()
    assert {name: getattr(dist.Store, name) for name in STORE_METHODS} == originals
    assert dist.PrefixStore.__init__ is original_init

    (path,) = tmp_path.iterdir()
    records = read_raw_trace(path).records
    stores = [r for r in records if r["k"] == "store"]
    here = Path(__file__).name
    assert all(Path(r["stack"][0][0]).name == here for r in stores), stores
    tcp = f"tcp:{base.port}"
    assert [(r["op"], r["store"], r["keys"], r["block"]) for r in stores] == [
        ("set", tcp, ["ready"], False),
        ("get", tcp, ["ready"], True),
        ("add", tcp, ["n"], False),
        ("wait", tcp, ["n"], True),
        ("wait", tcp, ["never"], True),
        ("check", tcp, ["n"], False),
        ("set", None, ["h"], False),
    ]
    assert stores[0]["prefix"] == stores[1]["prefix"] and stores[0]["prefix"].endswith("/")
    assert stores[2]["prefix"] == "outer/mine/"
    assert stores[3]["timeout"] == 5 and stores[4]["timeout"] == 0.05
    rets = {r["id"]: r for r in records if r["k"] == "ret"}
    assert "err" not in rets[stores[1]["id"]] and "err" not in rets[stores[3]["id"]]
    assert "err" in rets[stores[4]["id"]]
    assert stores[0]["id"] not in rets  # a set has no ret
