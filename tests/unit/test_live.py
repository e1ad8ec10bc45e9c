"""The live monitor on trace files written by the test: no torch, no processes.

A fake job stands for the launched processes; the traces are written with the
builders of ``trace_builders`` and appended to as the test goes, and the monitor is
driven one poll (``step``) at a time.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from dl2.live import faults as faults_mod
from dl2.live import monitor as monitor_mod
from dl2.live.monitor import Monitor
from dl2.live.monitor import MonitorOptions
from dl2.live.shared import SharedState
from dl2.live.shared import StoreAddress
from dl2.live.shared import parse_store
from dl2.live.shared import store_from_command
from dl2.live.tailer import TraceTailer
from dl2.report import FindingKind
from dl2.report import Verdict
from trace_builders import RankBuilder
from trace_builders import ranks
from trace_builders import write_run_dir

POLL = 0.02


class FakeJob:
    """Ranked processes that run until the test (or the monitor) ends them."""

    ranked = True

    def __init__(self, world: int) -> None:
        self.codes: dict[int, int | None] = {r: None for r in range(world)}
        self.stopped_by_dl2 = False
        self.stops = 0

    def poll(self) -> dict[int, int | None]:
        return dict(self.codes)

    def finished(self) -> bool:
        return all(c is not None for c in self.codes.values())

    def exit_code(self) -> int:
        return next((c for c in self.codes.values() if c), 0)

    def stop(self, extra_pids: Any = (), grace: float = 3.0) -> None:
        self.stopped_by_dl2 = True
        self.stops += 1
        for rank, code in self.codes.items():
            if code is None:
                self.codes[rank] = -15


class FakeStore:
    """An in-memory stand-in for a TCPStore client; ``broken`` makes every call fail."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.broken = False

    def _ok(self) -> None:
        if self.broken:
            raise RuntimeError("Connection reset by peer")

    def set(self, key: str, value: bytes | str) -> None:
        self._ok()
        self.data[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key: str) -> bytes:
        self._ok()
        return self.data[key]

    def add(self, key: str, amount: int) -> int:
        self._ok()
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value

    def append(self, key: str, value: bytes | str) -> None:
        self._ok()
        extra = value.encode() if isinstance(value, str) else bytes(value)
        self.data[key] = self.data.get(key, b"") + extra

    def check(self, keys: list[str]) -> bool:
        self._ok()
        return all(k in self.data for k in keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(k) for k in keys]

    def delete_key(self, key: str) -> bool:
        self._ok()
        return self.data.pop(key, None) is not None


def append(directory: Path, builder: RankBuilder, *records: str) -> None:
    """Append encoded records to a rank's trace file (as the rank would)."""
    path = next(directory.glob(f"rank{builder.rank:05d}.*"))
    with path.open("ab") as handle:
        for record in records:
            handle.write(record.encode())


def make_monitor(run_dir: Path, job: FakeJob, notices: list[str], **options: Any) -> Monitor:
    options.setdefault("poll_interval", POLL)
    return Monitor(
        run_dir,
        job,  # type: ignore[arg-type]
        MonitorOptions(**options),
        notice=notices.append,
    )


def steps(monitor: Monitor, count: int) -> Any:
    """Poll ``count`` times (or until an outcome); return the outcome or None."""
    for _ in range(count):
        outcome = monitor.step()
        if outcome is not None:
            return outcome
        time.sleep(POLL)
    return None


def send_send(tmp_path: Path) -> tuple[Path, list[RankBuilder]]:
    r0, r1 = ranks(2)
    r0.call("send", 17, peer=1, complete=False)
    r1.call("send", 17, peer=0, complete=False)
    return write_run_dir([r0, r1], tmp_path / "run"), [r0, r1]


# -- the proof ------------------------------------------------------------------------------


def test_deadlock_is_proven_from_two_snapshots_and_stops_the_job(tmp_path):
    # GIVEN two ranks each blocked in a send to the other
    run_dir, _ = send_send(tmp_path)
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices)
    # WHEN the monitor polls
    outcome = steps(monitor, 20)
    # THEN it proves the deadlock, stops the job and says when
    assert outcome is not None and outcome.reason == "deadlock"
    assert job.stops == 1
    assert outcome.report.verdict is Verdict.DEADLOCK
    assert outcome.report.findings[0].ranks == (0, 1)
    assert outcome.verdict_wall_time is not None and outcome.detected_after is not None


def test_progress_between_the_two_snapshots_is_no_proof(tmp_path, monkeypatch):
    # GIVEN a deadlock candidate seen once
    run_dir, (r0, _) = send_send(tmp_path)
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices)
    seen: list[frozenset[int]] = []
    original = monitor._prove

    def prove(built: Any, now: float) -> Any:
        if built.wfg.deadlocked and not seen:
            seen.append(built.wfg.deadlocked)
            original(built, now)  # the first snapshot makes the candidate
            # WHEN rank 0 writes a record before the second snapshot
            append(run_dir, r0, r0.done(99).records[-1])
            return None
        return original(built, now)

    monkeypatch.setattr(monitor, "_prove", prove)
    outcome = steps(monitor, 3)
    # THEN no verdict comes from that pair of snapshots
    assert seen and outcome is None
    # and the verdict comes later, once the ranks stay still
    assert steps(monitor, 20).reason == "deadlock"


def test_report_mode_reports_once_and_keeps_the_job(tmp_path):
    run_dir, _ = send_send(tmp_path)
    job, notices = FakeJob(2), []
    reports: list[Any] = []
    monitor = Monitor(
        run_dir,
        job,  # type: ignore[arg-type]
        MonitorOptions(poll_interval=POLL, on_deadlock="report"),
        on_report=reports.append,
        notice=notices.append,
    )
    assert steps(monitor, 25) is None
    assert len(reports) == 1 and reports[0].verdict is Verdict.DEADLOCK
    assert job.stops == 0
    assert sum("deadlock proven" in n for n in notices) == 1


def test_wait_mode_neither_reports_nor_stops_until_the_hang_timeout(tmp_path):
    run_dir, _ = send_send(tmp_path)
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices, on_deadlock="wait", hang_timeout=0.5)
    assert steps(monitor, 5) is None and job.stops == 0
    outcome = steps(monitor, 100)
    assert outcome.reason == "hang-timeout" and job.stops == 1
    assert outcome.report.verdict is Verdict.DEADLOCK


def test_a_rank_stuck_in_a_call_its_peers_matched_still_reaches_the_hang_timeout(tmp_path):
    # GIVEN rank 0 created group 1 and waits in a barrier; rank 1 never returns from
    # creating the same group (gloo paired it otherwise), so the model sees no cycle
    r0, r1 = ranks(2)
    r0.create_group("1", [0, 1], line=5)
    r0.call("barrier", 9, complete=False)
    r1.create_group("1", [0, 1], line=5, complete=False)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices, hang_timeout=0.3)
    # WHEN the monitor polls past the hang timeout
    outcome = steps(monitor, 100)
    # THEN it stops the job on the hang timeout instead of waiting forever
    assert outcome is not None and outcome.reason == "hang-timeout"
    assert job.stops == 1


@pytest.mark.parametrize("helper", ["working", "in-communication"])
def test_a_thread_outside_communication_keeps_the_hang_timeout_off(tmp_path, helper):
    # GIVEN ranks 0 and 1 each blocked in a recv from the other in their main thread,
    # rank 0 with a thread of the user's code alive (an uploader that will send, later)
    r0, r1 = ranks(2)
    r0.threads(1)
    if helper == "in-communication":  # that thread is itself blocked in a call
        r0.call("all_reduce", 40, count=1, complete=False, tid=2)
    r0.call("recv", 17, peer=1, complete=False)
    r1.call("recv", 19, peer=0, complete=False)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices, on_deadlock="wait", hang_timeout=0.3)
    # WHEN the monitor polls well past the hang timeout
    outcome = steps(monitor, 60)
    # THEN a thread working outside communication may yet release them: never stopped;
    # one that is blocked in communication too is no such thread
    if helper == "working":
        assert outcome is None and job.stops == 0
    else:
        assert outcome is not None and outcome.reason == "hang-timeout"


def test_a_store_get_in_a_wait_cycle_is_proven_online(tmp_path):
    # GIVEN rank 0 in store.get('ready'), rank 1 in the all_reduce it sets 'ready' after
    r0, r1 = ranks(2)
    r0.store("get", 12, ["ready"], complete=False)
    r1.call("all_reduce", 21, complete=False)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices)
    # WHEN the monitor polls: rank 0 counts as in communication
    outcome = steps(monitor, 20)
    # THEN it proves the deadlock from the store wait
    assert outcome is not None and outcome.reason == "deadlock" and job.stops == 1
    first = outcome.report.findings[0]
    assert first.ranks == (0, 1) and first.ops[0].op == "store_get"


def stalled_on_pending(tmp_path: Path, where: str) -> tuple[Monitor, FakeJob, RankBuilder, int]:
    """Rank 0 with an async all_reduce pending, which its watchdog reported as ``where``
    (stalled on it), and rank 1 in a recv from rank 0: the monitor, job, rank 0's
    builder and the all_reduce's id."""
    r0, r1 = ranks(2)
    work = r0.issue("all_reduce", 23, **{"async": True})
    r0.state([work], where)
    r1.call("recv", 29, peer=0, complete=False)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    job = FakeJob(2)
    return make_monitor(run_dir, job, [], hang_timeout=30), job, r0, work


@pytest.mark.parametrize("runs_on", [False, True])
def test_a_rank_held_only_by_its_watchdogs_word_is_proven_after_a_grace(tmp_path, runs_on):
    # GIVEN rank 0 stalled on a pending all_reduce by one look of its watchdog ("comm")
    monitor, job, r0, work = stalled_on_pending(tmp_path, "comm")
    # WHEN the monitor polls for less than the grace: one look is one instant
    started = time.monotonic()
    while time.monotonic() - started < monitor_mod.STATE_GRACE_S / 2:
        assert monitor.step() is None
        time.sleep(POLL)
    if runs_on:
        # the next look finds the rank computing: it was a passing instant
        r0.state([work], "python")
        path = next((tmp_path / "run").glob("rank00000*"))
        with path.open("a") as handle:
            handle.write(r0.records[-1])
    outcome = steps(monitor, 50)
    # THEN a rank that stays there is proven deadlocked once the grace has passed; one
    # seen running on within it is not
    if runs_on:
        assert outcome is None and job.stops == 0
    else:
        assert outcome is not None and outcome.reason == "deadlock"
        assert time.monotonic() - started >= monitor_mod.STATE_GRACE_S


def test_a_rank_stalled_in_backward_needs_no_grace(tmp_path):
    # GIVEN rank 0 stalled on DDP's pending all_reduce, seen still inside backward for
    # 2 s (several looks already), or by one look saying "comm"
    monitor, _, _, _ = stalled_on_pending(tmp_path / "backward", "backward")
    comm, _, _, _ = stalled_on_pending(tmp_path / "comm", "comm")
    # THEN only the one look gets the grace; the deadlock is proven either way
    for watched, graced in ((monitor, False), (comm, True)):
        watched.tailer.refresh()
        graph = watched.tailer.model.graph()
        assert monitor_mod._held_by_state(graph, 0) is graced
    outcome = steps(monitor, 50)
    assert outcome is not None and outcome.reason == "deadlock"


def test_a_store_wait_nobody_can_explain_reaches_the_hang_timeout(tmp_path):
    # GIVEN rank 0 in a get on a store dl2 cannot tell (no clause), rank 1 waiting on it
    r0, r1 = ranks(2)
    r0.store("get", 12, ["ready"], store=None, complete=False)
    r1.call("all_reduce", 21, complete=False)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices, hang_timeout=0.3)
    # THEN no deadlock is claimed, but both ranks sit in calls: the hang timeout ends it
    outcome = steps(monitor, 100)
    assert outcome is not None and outcome.reason == "hang-timeout" and job.stops == 1


# -- hang suspects --------------------------------------------------------------------------


def suspect_case(tmp_path: Path) -> tuple[Path, list[RankBuilder]]:
    r0, r1 = ranks(2)
    r0.call("all_reduce", 11, complete=False)
    r1.state([], "python", stack=[["train.py", 10, "slow"], ["train.py", 30, "main"]])
    return write_run_dir([r0, r1], tmp_path / "run"), [r0, r1]


def test_hang_suspect_is_printed_once_with_its_stack_and_never_stops_the_job(tmp_path):
    # GIVEN rank 0 in all_reduce, rank 1 in Python code for longer than suspect_after
    run_dir, _ = suspect_case(tmp_path)
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices, suspect_after=0.1, hang_timeout=0.2)
    # WHEN the monitor polls well past both thresholds
    outcome = steps(monitor, 40)
    # THEN one suspect notice names rank 1 and its line; the job is never stopped
    assert outcome is None and job.stops == 0
    suspects = [n for n in notices if n.startswith("hang suspect")]
    assert len(suspects) == 1
    assert "Rank 1" in suspects[0] and "train.py:10 in slow" in suspects[0]
    # and the final report of a job still stuck (here: interrupted) carries it
    monitor.stop_job()
    final = monitor._final("interrupted")
    kinds = [f.kind for f in final.report.findings]
    assert FindingKind.HANG_SUSPECT in kinds and FindingKind.DEADLOCK not in kinds


# -- faults ---------------------------------------------------------------------------------


def test_truncated_record_is_read_once_complete(tmp_path):
    r0 = RankBuilder(0, 1)
    run_dir = write_run_dir([r0], tmp_path / "run")
    path = next(run_dir.glob("rank*"))
    r0.issue("barrier", 1, returned=False)
    line = r0.records[-1].encode()
    tailer = TraceTailer(run_dir)
    with path.open("ab") as handle:
        handle.write(line[:10])
    tailer.refresh()
    assert tailer.progress() == {0: 0}
    assert tailer.traces()[0].truncated
    with path.open("ab") as handle:
        handle.write(line[10:])
    tailer.refresh()
    assert tailer.progress() == {0: 1} and tailer.traces()[0].truncated is None
    assert tailer.possibly_blocked() == {0}


def test_a_partial_record_that_stays_turns_live_detection_off(tmp_path, monkeypatch):
    monkeypatch.setattr(faults_mod, "PARTIAL_WRITE_S", 0.05)
    run_dir, _ = send_send(tmp_path)
    path = next(run_dir.glob("rank00000*"))
    with path.open("ab") as handle:
        handle.write(b'{"k":"ret","id"')
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices)
    assert steps(monitor, 20) is None and job.stops == 0
    assert any("partial record" in n and "post-mortem" in n for n in notices)


def test_a_full_trace_directory_degrades_to_post_mortem(tmp_path, monkeypatch):
    # GIVEN a deadlock, but a trace directory with almost no space left
    run_dir, _ = send_send(tmp_path)

    class Tiny:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(faults_mod.os, "statvfs", lambda path: Tiny())
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices, hang_timeout=0.1)
    # THEN no live verdict and no stop (records may be missing), and it says so
    assert steps(monitor, 20) is None and job.stops == 0
    assert sum("nearly full" in n for n in notices) == 1
    # and when the job ends, the traces are analysed post mortem, with the warning
    job.codes = {0: 1, 1: 1}
    final = monitor.step()
    assert final.reason == "finished"
    assert any("post-mortem" in n for n in final.notes)


def test_a_killed_rank_ends_the_job_and_its_peer_wait_is_orphaned(tmp_path):
    r0, r1 = ranks(2)
    r0.call("recv", 21, peer=1, complete=False)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices)
    assert steps(monitor, 2) is None
    job.codes[1] = -9
    outcome = steps(monitor, int(2 * monitor_mod.FAILED_GRACE_S / POLL))
    assert outcome.reason == "rank-failed" and job.stops == 1
    orphaned = [f for f in outcome.report.findings if f.kind is FindingKind.ORPHANED_WAIT]
    assert orphaned and orphaned[0].ranks == (0, 1)
    assert orphaned[0].ops[0].line == 21


# -- several nodes --------------------------------------------------------------------------


def two_nodes(tmp_path: Path, store: FakeStore, **options: Any) -> tuple[Monitor, Monitor, list]:
    r0, r1 = ranks(2)
    r0.call("send", 17, peer=1, complete=False)
    r1.call("send", 17, peer=0, complete=False)
    dirs = [write_run_dir([b], tmp_path / f"node{b.rank}") for b in (r0, r1)]
    notices: list[str] = []
    monitors = []
    for rank, run_dir in enumerate(dirs):
        job = FakeJob(1)
        job.codes = {rank: None}
        job.ranked = False
        job.poll = lambda job=job: {-1: None if not job.stopped_by_dl2 else -15}  # type: ignore
        shared = SharedState(StoreAddress("h", 1, "job"), str(run_dir), connect=lambda a: store)
        options.setdefault("poll_interval", POLL)
        monitor = Monitor(
            run_dir,
            job,  # type: ignore[arg-type]
            MonitorOptions(ack_timeout=0.05, **options),
            notice=notices.append,
            shared=shared,
            render_json=lambda report: json.dumps({"verdict": report.verdict.value}),
        )
        monitors.append(monitor)
    return monitors[0], monitors[1], notices


@pytest.fixture
def alive(monkeypatch):
    """Every rank process named in a header counts as alive."""
    monkeypatch.setattr(monitor_mod, "process_alive", lambda pid: True)


def step_both(leader: Monitor, follower: Monitor, count: int) -> tuple[Any, Any]:
    for _ in range(count):
        first = leader.step()
        second = follower.step()
        if first is not None or second is not None:
            return first, second or follower.step()
        time.sleep(POLL)
    return None, None


def test_the_node_of_rank_0_reports_and_the_other_follows(tmp_path, alive):
    store = FakeStore()
    leader, follower, _ = two_nodes(tmp_path, store)
    first, second = step_both(leader, follower, 60)
    assert first is not None and first.reason == "deadlock"
    assert first.report.findings[0].ranks == (0, 1)
    assert second is not None and second.reason == "remote-verdict"
    assert second.remote["ranks"] == [0, 1] and second.remote["exit_code"] == 3
    assert json.loads(second.remote_report) == {"verdict": "deadlock"}
    assert leader.job.stopped_by_dl2 and follower.job.stopped_by_dl2
    # the leader deleted every chunk it read: the store holds only what is in flight
    assert not [k for k in store.data if k.startswith("dl2/job/f/") and not k.endswith("/n")]


def test_no_verdict_until_the_other_node_has_read_its_files_again(tmp_path, alive):
    store = FakeStore()
    leader, follower, _ = two_nodes(tmp_path, store)
    # both nodes connected and mirrored once
    for _ in range(40):
        leader.step()
        if leader.proof.candidate is not None:
            break
        follower.step()
        time.sleep(POLL)
    assert leader.proof.candidate is not None
    # WHEN only the leader polls, the remote member's state is never re-read
    assert steps(leader, 10) is None
    # THEN once the follower pushes again, the proof completes
    follower.step()
    assert steps(leader, 5).reason == "deadlock"


def test_a_lost_store_means_local_only_analysis(tmp_path, alive):
    store = FakeStore()
    leader, follower, notices = two_nodes(tmp_path, store)
    for _ in range(10):
        leader.step()
        follower.step()
        if leader.shared.ready and follower.shared.ready:
            break
        time.sleep(POLL)
    store.broken = True
    assert step_both(leader, follower, 20) == (None, None)
    assert sum("lost the job's store" in n for n in notices) == 2
    assert leader.tailer.progress().keys() == {0}
    assert any("local-only" in n for n in leader.notes)


RDZV = ["--rdzv-endpoint=h:29400", "t.py"]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["torchrun", "--nproc-per-node", "2", "t.py"], None),
        (["torchrun", "--standalone", "--nnodes", "2", "t.py"], None),
        (
            ["torchrun", "--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:1234", "t.py", "--nnodes"],
            StoreAddress("10.0.0.1", 1234, "none", "--rdzv-endpoint"),
        ),
        (
            ["/x/python", "-m", "torch.distributed.run", "--nnodes=1:4", "--rdzv_id=abc", *RDZV],
            StoreAddress("h", 29400, "abc", "--rdzv-endpoint"),
        ),
        (
            ["torchrun", "--nnodes", "2", "--master-addr", "m", "--master-port", "7", "t.py"],
            StoreAddress("m", 7, "none", "--master-addr"),
        ),
        (["python", "t.py", "--nnodes", "2"], None),
    ],
)
def test_store_address_from_a_torchrun_command(command, expected):
    assert store_from_command(command) == expected


def test_store_option_and_an_unknown_store():
    assert parse_store("h:12/run") == StoreAddress("h", 12, "run", "--store")
    with pytest.raises(ValueError):
        parse_store("nohost")
    with pytest.raises(ValueError):
        store_from_command(["torchrun", "--nnodes", "2", "t.py"])


def test_the_monitor_never_imports_torch_on_one_node(tmp_path):
    code = "import sys, dl2.live.monitor, dl2.cli.run; sys.exit(1 if 'torch' in sys.modules else 0)"
    import subprocess
    import sys

    env = dict(os.environ)
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0


def test_the_monitor_reads_a_long_history_into_a_bounded_model(tmp_path):
    # GIVEN two ranks that ran 2,000 all_reduce calls, read as they were written
    r0, r1 = ranks(2)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    job, notices = FakeJob(2), []
    monitor = make_monitor(run_dir, job, notices, window=100)
    for _ in range(20):
        for builder in (r0, r1):
            start = len(builder.records)
            for step in range(100):
                builder.call("all_reduce", 10 + step % 3)
            append(run_dir, builder, *builder.records[start:])
        assert monitor.step() is None
    model = monitor.tailer.model
    # THEN the model keeps its window, not the history
    assert model.matcher.retained <= 100 + 400 and model.matcher.folded >= 3000
    # WHEN both ranks then block sending to each other
    for builder in (r0, r1):
        start = len(builder.records)
        builder.call("send", 17, peer=1 - builder.rank, complete=False)
        append(run_dir, builder, *builder.records[start:])
    outcome = steps(monitor, 20)
    # THEN the deadlock is proven as on a short trace, with its lines
    assert outcome is not None and outcome.reason == "deadlock"
    finding = outcome.report.findings[0]
    assert finding.cycle == (0, 1) and {(o.file, o.line) for o in finding.ops} == {("train.py", 17)}


def test_has_children_sees_a_live_child_process():
    import subprocess
    import sys

    from dl2.live.launcher import has_children

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert has_children(os.getpid())
    finally:
        child.kill()
        child.wait(timeout=30)
    assert not has_children(child.pid)  # gone (and no children of its own)
    assert not has_children(-1)


def test_a_proof_with_a_grace_waits_that_long_with_the_set_unchanged():
    from dl2.live.proof import DeadlockProof
    from dl2.live.proof import Step

    proof = DeadlockProof()
    members = frozenset({0, 1})

    def observe(now: float, grace: float) -> Step:
        return proof.observe(
            members,
            {0: 5, 1: 7},
            writing=frozenset,
            fresh=lambda ranks, req: True,
            bump=lambda: 0,
            now=now,
            grace=grace,
        )

    # GIVEN a member seems inside an async call (its return may be held back 0.2 s)
    assert observe(10.0, 0.5) is Step.CANDIDATE
    # THEN the same set read again 0.1 s later is not yet a proof; 0.5 s later it is
    assert observe(10.1, 0.5) is Step.CANDIDATE
    assert observe(10.5, 0.5) is Step.PROVEN
    # AND without a grace, the second read proves it
    proof.reset()
    assert observe(20.0, 0.0) is Step.CANDIDATE
    assert observe(20.05, 0.0) is Step.PROVEN


def test_a_rank_whose_async_op_has_no_return_yet_is_issuing():
    from dl2.live.monitor import _issuing
    from dl2.model.execution_graph import build_execution_graph
    from trace_builders import ranks
    from trace_builders import session

    r0, r1 = ranks(2)
    r0.issue("all_reduce", 18, returned=False, **{"async": True})  # its ret held back
    r1.call("recv", 27, peer=0, complete=False)
    graph = build_execution_graph(session([r0, r1]))
    assert _issuing(graph, 0)
    assert not _issuing(graph, 1)  # inside a blocking recv


def test_a_store_that_went_away_prints_no_cpp_stack_into_dl2s_output(tmp_path: Path) -> None:
    """Node 0's agent exits with the store: the monitor's next call fails in one line
    of its own, with no C++ warning and stack from torch, and the level is not left set
    for anything the monitor launches later."""
    pytest.importorskip("torch")
    import subprocess
    import sys
    import textwrap

    server = textwrap.dedent(
        """
        import sys, time
        from torch.distributed import TCPStore
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        print(store.port, flush=True)
        sys.stdin.read()  # until the client says it is connected
        """
    )
    client = textwrap.dedent(
        """
        import os, sys, time
        from dl2.live.shared import StoreAddress, connect_tcp_store
        store = connect_tcp_store(StoreAddress("127.0.0.1", int(sys.argv[1]), "job", "--store"))
        assert store.add("k", 1) == 1
        assert "TORCH_CPP_LOG_LEVEL" not in os.environ
        print("connected", flush=True)
        sys.stdin.readline()  # the server is gone
        try:
            store.add("k", 1)
        except Exception as err:
            print("lost:", type(err).__name__, flush=True)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    host = subprocess.Popen(
        [sys.executable, "-c", server], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        assert host.stdout is not None and host.stdin is not None
        port = host.stdout.readline().decode().strip()
        user = subprocess.Popen(
            [sys.executable, "-c", client, port],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert user.stdout is not None and user.stdin is not None
        assert user.stdout.readline() == b"connected\n"
        host.stdin.close()
        host.wait(timeout=60)
        out, err = user.communicate(b"\n", timeout=60)
    finally:
        for proc in (host, locals().get("user")):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert out.decode().startswith("lost:"), (out, err)
    assert b"recvValue" not in err and b"frame #" not in err, err.decode()


def test_a_foreign_launchers_rank_that_raised_is_failed_not_exited(tmp_path, monkeypatch):
    # GIVEN a job dl2 did not launch rank by rank (its own launcher): rank 0 ended with an
    # uncaught exception, rank 1 ended cleanly, rank 2 vanished (no end record)
    monkeypatch.setattr(monitor_mod, "process_alive", lambda pid: False)
    r0, r1, r2 = ranks(3)
    r0.end(err="RuntimeError: Connection closed by peer", line=14)
    r1.end()
    run_dir = write_run_dir([r0, r1, r2], tmp_path)
    job = FakeJob(1)
    job.ranked = False
    monitor = Monitor(run_dir, job, MonitorOptions(poll_interval=POLL))  # type: ignore[arg-type]
    monitor.tailer.refresh()
    # THEN only the rank that ended cleanly exited; Python exits with status 1 after an
    # uncaught exception
    assert monitor.process_states() == {0: "failed", 1: "exited", 2: "failed"}


@pytest.mark.parametrize("launched_by_dl2", [True, False])
def test_a_rank_still_starting_keeps_the_others_wait_from_the_hang_timeout(
    tmp_path, launched_by_dl2, alive
):
    # GIVEN ranks 0 and 1 blocked creating the world group, rank 2 alive but still in its
    # own code before init_process_group (no trace yet: a slow download, an import)
    r0, r1, _ = ranks(3)
    for r in (r0, r1):
        r.create_group("0", [0, 1, 2], line=5, complete=False)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    job, notices = FakeJob(3), []
    job.ranked = launched_by_dl2  # dl2 knows rank 2's process only when it started it
    if not launched_by_dl2:
        job.poll = lambda: {-1: None}  # type: ignore[method-assign]
    monitor = make_monitor(run_dir, job, notices, hang_timeout=0.1)
    # WHEN the monitor polls past the hang timeout
    outcome = steps(monitor, 30)
    # THEN a rank dl2 knows alive is running its own code: the job runs on; a rank it
    # cannot see is left out, as before
    if launched_by_dl2:
        assert outcome is None and job.stops == 0
    else:
        assert outcome is not None and outcome.reason == "hang-timeout"


def test_a_launched_rank_waiting_in_the_rendezvous_without_a_trace_is_stuck(tmp_path, alive):
    from types import SimpleNamespace

    from dl2.record.writer import rendezvous_mark

    # GIVEN rank 1 blocked creating the world group, ranks 0 and 2 alive without a trace
    # (dl2 launched them): rank 2 still in its own code, rank 0 in torch's rendezvous,
    # where it hosts the store and waits for ranks that never come
    _, r1, _ = ranks(3)
    r1.create_group("0", [0, 1, 2], line=5, complete=False)
    run_dir = write_run_dir([r1], tmp_path / "run")
    job = FakeJob(3)
    job.procs = {r: SimpleNamespace(pid=90_000 + r) for r in range(3)}  # type: ignore[attr-defined]
    open(rendezvous_mark(str(run_dir), 90_000), "wb").close()
    monitor = make_monitor(run_dir, job, [], hang_timeout=0.1)
    # THEN rank 2 keeps the job running; once it too waits there, the hang timeout ends it
    assert steps(monitor, 20) is None
    open(rendezvous_mark(str(run_dir), 90_002), "wb").close()
    outcome = steps(monitor, 30)
    assert outcome is not None and outcome.reason == "hang-timeout"


@pytest.mark.parametrize("third", ["starting", "in-rendezvous", "not-recorded"])
def test_a_rank_starting_under_another_launcher_keeps_the_hang_timeout_off(tmp_path, third, alive):
    import subprocess
    import sys

    from dl2.record.writer import rendezvous_mark

    # GIVEN ranks 0 and 1 blocked creating the world group under a launcher dl2 does not
    # know the ranks of (mp.spawn), whose third process has no trace yet: rank 2 still
    # preparing its data; or waiting in torch's rendezvous for a rank that never comes
    # (it hosts the store: a world size larger than the ranks launched); or a process
    # that is no rank of the job (dl2's environment not passed on to it)
    recorded = third != "not-recorded"
    r0, r1, _ = ranks(3)
    for r in (r0, r1):
        r.create_group("0", [0, 1, 2], line=5, complete=False)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    env = dict(os.environ)
    env.pop("DL2_RUN_DIR", None)
    child_env = {"DL2_RUN_DIR": str(run_dir)} if recorded else {}
    spawn = (
        "import os, subprocess, sys, time;"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        f" env=dict(os.environ, **{child_env!r}));"
        "print(child.pid, flush=True); time.sleep(60)"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", spawn], env=env, stdout=subprocess.PIPE, text=True
    )
    child = 0
    try:
        assert launcher.stdout is not None
        child = int(launcher.stdout.readline())
        if third == "in-rendezvous":
            open(rendezvous_mark(str(run_dir), child), "wb").close()
        job, notices = FakeJob(3), []
        job.ranked = False
        job.procs = {-1: launcher}  # type: ignore[attr-defined]
        job.poll = lambda: {-1: None}  # type: ignore[method-assign]
        monitor = make_monitor(run_dir, job, notices, hang_timeout=0.1)
        # WHEN the monitor polls past the hang timeout
        outcome = steps(monitor, 30)
        # THEN a process of the job that may be the missing rank holds the timeout, said
        # once with its pid; one in the rendezvous, or without dl2's environment, does not
        if third == "starting":
            assert outcome is None and job.stops == 0
            (said,) = [n for n in notices if "not reached init_process_group" in n]
            assert str(child) in said
        else:
            assert outcome is not None and outcome.reason == "hang-timeout"
    finally:
        launcher.kill()
        launcher.wait(10)
        if child:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_launcher_that_exited_0_vouches_for_ranks_gone_without_an_end(tmp_path, monkeypatch):
    # GIVEN torchrun (a foreign launcher) exited 0 after its ranks ended with os._exit(0):
    # no end record, no exit status dl2 could see
    monkeypatch.setattr(monitor_mod, "process_alive", lambda pid: False)
    r0, r1 = ranks(2)
    r0.call("all_reduce", 5)
    r1.call("all_reduce", 5)
    r1.end(err="ValueError: bad batch", line=9)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    job = FakeJob(1)
    job.ranked = False
    job.poll = lambda: {-1: 0}  # type: ignore[method-assign]
    monitor = make_monitor(run_dir, job, [])
    monitor.tailer.refresh()
    # THEN the rank gone without an end exited; the one that raised still failed
    assert monitor.process_states() == {0: "exited", 1: "failed"}
    job.poll = lambda: {-1: 1}  # type: ignore[method-assign]
    assert monitor.process_states() == {0: "failed", 1: "failed"}


@pytest.mark.parametrize("left_running", [True, False])
def test_ranks_a_launcher_left_behind_when_it_exited_are_still_followed(
    tmp_path, monkeypatch, left_running
):
    # GIVEN a launcher that exited 0 at once (it starts its ranks and leaves) whose
    # ranks, blocked in a send/send, still run (or ended)
    monkeypatch.setattr(monitor_mod, "process_alive", lambda pid: left_running)
    r0, r1 = ranks(2)
    r0.call("send", 17, peer=1, complete=False)
    r1.call("send", 17, peer=0, complete=False)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    job, notices = FakeJob(1), []
    job.ranked = False
    job.codes = {-1: 0}
    monitor = make_monitor(run_dir, job, notices)
    outcome = steps(monitor, 30)
    # THEN ranks left running are followed (the deadlock is proven and they are
    # stopped); ranks gone end the run
    if left_running:
        assert outcome.reason == "deadlock" and job.stops == 1, notices
        assert any("still run" in n for n in notices), notices
    else:
        assert outcome.reason == "finished" and job.stops == 0


def test_ranks_a_killed_launcher_left_behind_are_stopped_and_read_as_ended_from_outside(
    tmp_path, monkeypatch
):
    # GIVEN `timeout -s KILL ... torchrun`: the launcher killed (status -9), its ranks
    # left running: rank 0 blocked in a barrier, rank 1 in its own code
    monkeypatch.setattr(monitor_mod, "process_alive", lambda pid: True)
    monkeypatch.setattr(monitor_mod, "FAILED_GRACE_S", 0.05)
    r0, r1 = ranks(2)
    r0.call("barrier", 12, complete=False)
    r1.call("barrier", 12)
    run_dir = write_run_dir([r0, r1], tmp_path / "run")
    job, notices = FakeJob(1), []
    job.ranked = False
    job.codes = {-1: -9}
    monitor = make_monitor(run_dir, job, notices)
    outcome = steps(monitor, 30)
    # THEN dl2 stops the ranks left behind and says why
    assert outcome.reason == "interrupted" and job.stops == 1
    assert outcome.stop_note.startswith("the launched command ended (signal 9) while ranks 0")


@pytest.mark.parametrize("last", [False, True])
def test_stop_signals_raise_once_and_after_the_last_stay_ignored(last):
    from dl2.live.watch import stop_signals

    before = signal.getsignal(signal.SIGINT)
    try:
        raised = 0
        with stop_signals(last=last):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
            except KeyboardInterrupt:
                raised += 1
            os.kill(os.getpid(), signal.SIGINT)  # a second one while concluding: ignored
            time.sleep(0.05)
        # THEN one KeyboardInterrupt; after a command line's last one (the process ends
        # next) a late signal cannot kill it, elsewhere the previous handler is back
        assert raised == 1
        expected = signal.SIG_IGN if last else before
        assert signal.getsignal(signal.SIGINT) is expected
    finally:
        signal.signal(signal.SIGINT, before)
