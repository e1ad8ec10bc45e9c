"""The recorder in real gloo jobs (2 ranks on 127.0.0.1), installed by the bootstrap alone.

Each job runs a script from ``record_cases/`` with ``DL2_RUN_DIR`` set and the bootstrap
on ``PYTHONPATH``, exactly as ``dl2 run`` launches one, then reads the trace files back
with :func:`dl2.trace.format.read_trace_file` and checks the records as written
(:func:`trace_builders.read_raw_trace`).  Launches are shared between tests
(module-scoped fixtures); every process has a hard timeout and is killed by its own
process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ports import free_port
from teardown import ABORT
from trace_builders import RawTrace
from trace_builders import read_raw_trace

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "record_cases"
BOOTSTRAP = REPO / "src" / "dl2" / "_bootstrap"
JOB_TIMEOUT_S = 45


def job_env(run_dir: Path | None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DL2_RUN_DIR", None)
    env.pop("DL2_DISABLE", None)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP), str(REPO / "src")])
    env["PYTHONWARNINGS"] = "ignore"
    if run_dir is not None:
        env["DL2_RUN_DIR"] = str(run_dir)
    env.update(extra)
    return env


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    stdout: str = ""
    stderr: str = ""

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode


def start(args: list[str], env: dict[str, str]) -> Proc:
    popen = subprocess.Popen(
        [sys.executable, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: killable with its children
    )
    return Proc(popen)


def kill(proc: Proc) -> None:
    if proc.popen.poll() is None:
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def finish(procs: list[Proc], timeout_s: float = JOB_TIMEOUT_S) -> list[Proc]:
    """Wait for every process; kill them all (by process group) past the deadline."""
    deadline = time.monotonic() + timeout_s
    try:
        for proc in procs:
            left = max(0.1, deadline - time.monotonic())
            proc.stdout, proc.stderr = proc.popen.communicate(timeout=left)
    except subprocess.TimeoutExpired:
        for proc in procs:
            kill(proc)
        for proc in procs:
            proc.stdout, proc.stderr = proc.popen.communicate()
        pytest.fail("job timed out:\n" + "\n".join(p.stderr[-2000:] for p in procs))
    return procs


def launch_env_job(script: Path, run_dir: Path | None, out_dir: Path, n: int = 2) -> list[Proc]:
    """Start a torchrun-style job: one process per rank, rendezvous from the environment."""
    port = str(free_port())
    procs = []
    for rank in range(n):
        env = job_env(
            run_dir,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(n),
            LOCAL_WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            CASE_OUT=str(out_dir),
        )
        procs.append(start([str(script)], env))
    return procs


def traces(run_dir: Path) -> dict[int, RawTrace]:
    found = [read_raw_trace(p) for p in sorted(run_dir.glob("*.dl2.jsonl"))]
    return {t.rank: t for t in found}


def marks(script: Path) -> dict[str, int]:
    """``# mark: NAME`` comments of a case script -> line number."""
    lines = script.read_text().splitlines()
    return {
        line.split("# mark:")[1].strip(): number
        for number, line in enumerate(lines, start=1)
        if "# mark:" in line
    }


def ops(trace: RawTrace, **match: Any) -> list[dict[str, Any]]:
    return [
        r
        for r in trace.records
        if r["k"] == "op" and all(r.get(key) == value for key, value in match.items())
    ]


def by_id(trace: RawTrace, kind: str) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in trace.records if r["k"] == kind}


def waits_of(trace: RawTrace, op_id: int) -> list[dict[str, Any]]:
    return [r for r in trace.records if r["k"] == "wait" and r["work"] == op_id]


def ret_of(trace: RawTrace, record_id: int) -> dict[str, Any]:
    found = [r for r in trace.records if r["k"] == "ret" and r["id"] == record_id]
    assert len(found) == 1, f"expected one ret for {record_id}, got {found}"
    return found[0]


# -- the big job: every collective, P2P form, object collective, subgroup and DDP --------

EVERYTHING = CASES / "case_everything.py"
SPAWN = CASES / "case_spawn.py"
SMALL = CASES / "case_small.py"
HANG = CASES / "case_hang.py"


@dataclass
class EverythingRun:
    traces: dict[int, RawTrace]
    results: dict[int, Any]
    plain_results: dict[int, Any]
    marks: dict[str, int]


@dataclass
class Jobs:
    """Every job of this module, started together at first use (they overlap their
    start-up on the two cores) and awaited by the fixture of each scenario."""

    base: Path
    everything: list[Proc]
    plain: list[Proc]
    spawn: list[Proc]
    unwritable: list[Proc]
    hang: list[Proc]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    base = tmp_path_factory.mktemp("jobs")
    for name in ("out", "plain", "spawn-out", "unwritable-out", "hang-out"):
        (base / name).mkdir()
    (base / "a-file").write_text("")
    started = Jobs(
        base=base,
        everything=launch_env_job(EVERYTHING, base / "run", base / "out"),
        plain=launch_env_job(EVERYTHING, None, base / "plain"),
        spawn=[
            start(
                [str(SPAWN), str(free_port()), str(base / "spawn-out")],
                job_env(base / "spawn-run"),
            )
        ],
        unwritable=launch_env_job(SMALL, base / "a-file" / "run", base / "unwritable-out"),
        hang=launch_env_job(HANG, base / "hang-run", base / "hang-out"),
    )
    yield started
    everyone = (
        started.everything + started.plain + started.spawn + started.unwritable + started.hang
    )
    for proc in everyone:
        kill(proc)
    for proc in everyone:
        proc.popen.communicate()


def torn_down_after_work(procs: list[Proc], out_dir: Path) -> bool:
    """Whether a job's ranks all wrote their results and one then died of torch's abort
    at interpreter teardown (:mod:`teardown`): torch's flake, not the job's."""
    return any(p.returncode == -signal.SIGABRT and ABORT in p.stderr for p in procs) and all(
        (out_dir / f"rank{r}.json").exists() for r in range(len(procs))
    )


@pytest.fixture(scope="module")
def everything(jobs: Jobs) -> EverythingRun:
    base = jobs.base
    run_dir, out, plain = base / "run", base / "out", base / "plain"
    finish(jobs.everything + jobs.plain)
    if torn_down_after_work(jobs.everything, out) or torn_down_after_work(jobs.plain, plain):
        # once more, both jobs, in fresh directories
        run_dir, out, plain = base / "run-again", base / "out-again", base / "plain-again"
        out.mkdir()
        plain.mkdir()
        jobs.everything = launch_env_job(EVERYTHING, run_dir, out)
        jobs.plain = launch_env_job(EVERYTHING, None, plain)
        finish(jobs.everything + jobs.plain)
    for proc in jobs.everything + jobs.plain:
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (plain / "run").exists()

    def load(directory: Path) -> dict[int, Any]:
        return {r: json.loads((directory / f"rank{r}.json").read_text()) for r in range(2)}

    return EverythingRun(traces(run_dir), load(out), load(plain), marks(EVERYTHING))


def frame(run: EverythingRun, mark: str, function: str) -> list[Any]:
    return [str(EVERYTHING), run.marks[mark], function]


def test_results_identical_with_and_without_recording(everything: EverythingRun) -> None:
    assert everything.results == everything.plain_results
    assert everything.results[0]["all_reduce"] == [1.0, 3.0, 5.0, 7.0]
    # dist.get_backend() still says gloo to user code.
    assert everything.results[0]["backend"] == "gloo"


def test_one_readable_file_per_rank_with_header(everything: EverythingRun) -> None:
    assert sorted(everything.traces) == [0, 1]
    for rank, trace in everything.traces.items():
        assert trace.truncated is None
        header = trace.header
        assert header["rank"] == rank
        assert header["world_size"] == 2
        assert header["backend"] == "gloo"
        assert header["pid"] > 0
        assert header["argv"][0] == str(EVERYTHING)
        ids = [r["id"] for r in trace.records if r["k"] in ("op", "wait", "newgroup")]
        assert ids == sorted(ids)
        assert len(ids) == len(set(ids))


def test_default_group_creation(everything: EverythingRun) -> None:
    for trace in everything.traces.values():
        first = trace.records[0]
        assert first["k"] == "op"
        assert first["op"] == "create_group"
        assert first["gid"] == "0"
        assert first["ranks"] == [0, 1]
        assert first["seq"] is None
        assert first["api"] == "init_process_group"
        assert first["stack"][0] == frame(everything, "init", "main")
        assert set(ret_of(trace, first["id"])) == {"k", "id", "t"}


def test_collective_sequences_agree_across_ranks(everything: EverythingRun) -> None:
    def signature(trace: RawTrace) -> list[tuple[Any, ...]]:
        return [
            tuple(r.get(key) for key in ("seq", "op", "api", "dtype", "count", "root", "redop"))
            for r in ops(trace, gid="0")
            if r["op"] not in ("send", "recv", "create_group")
        ]

    sig0, sig1 = (signature(everything.traces[r]) for r in (0, 1))
    assert sig0 == sig1
    assert [s[0] for s in sig0] == list(range(len(sig0)))


@pytest.mark.parametrize(
    ("api", "op", "fields"),
    [
        ("all_reduce", "all_reduce", {"redop": "sum", "dtype": "float32", "count": 4}),
        ("broadcast", "broadcast", {"root": 1, "count": 3}),
        ("reduce", "reduce", {"root": 1, "redop": "product", "count": 2}),
        ("all_reduce_coalesced", "all_reduce_coalesced", {"redop": "sum", "count": 5}),
        ("all_gather", "all_gather", {"count": 2}),
        ("all_gather_into_tensor", "all_gather_into_tensor", {"count": 2}),
        ("all_gather_coalesced", "all_gather_coalesced", {"count": 2}),
        ("gather", "gather", {"root": 0, "count": 2}),
        ("scatter", "scatter", {"root": 0, "count": 3}),
        ("reduce_scatter", "reduce_scatter", {"redop": "sum", "count": 4}),
        ("reduce_scatter_tensor", "reduce_scatter_tensor", {"redop": "sum", "count": 4}),
        ("all_to_all", "all_to_all", {"count": 4, "splits": [[2, 2], [2, 2]]}),
        ("barrier", "barrier", {}),
        ("monitored_barrier", "monitored_barrier", {"timeout": 1800}),  # gloo default
        ("all_gather_tensor", "all_gather_into_tensor_coalesced", {"count": 2, "async": True}),
    ],
)
def test_each_collective_is_recorded(
    everything: EverythingRun, api: str, op: str, fields: dict[str, Any]
) -> None:
    for trace in everything.traces.values():
        found = ops(trace, api=api, op=op)
        assert found, f"no {op} from {api} on rank {trace.rank}"
        record = found[0]
        assert record["gid"] == "0"
        assert record["async"] is fields.get("async", False)
        for key, value in fields.items():
            assert record[key] == value, (key, record)
        if op != "monitored_barrier":  # synchronous: no work, no wait
            assert waits_of(trace, record["id"])
        assert ret_of(trace, record["id"])
        assert record["stack"][0][2] == "collectives"


def test_all_reduce_max_and_stack_line(everything: EverythingRun) -> None:
    for trace in everything.traces.values():
        first, maximum = ops(trace, api="all_reduce", gid="0")[:2]
        assert first["stack"][0] == frame(everything, "all_reduce", "collectives")
        assert first["stack"][1][2] == "main"
        assert maximum["redop"] == "max"
        (wait,) = waits_of(trace, first["id"])
        assert wait["stack"] == first["stack"]
        assert ret_of(trace, wait["id"])


def test_all_to_all_single_splits(everything: EverythingRun) -> None:
    even0, uneven0 = ops(everything.traces[0], op="all_to_all_single")
    even1, uneven1 = ops(everything.traces[1], op="all_to_all_single")
    assert even0["splits"] == even1["splits"] == [[2, 2], [2, 2]]
    assert uneven0["splits"] == [[1, 2], [1, 2]]
    assert uneven1["splits"] == [[2, 1], [2, 1]]
    # What 0 sends to 1 is what 1 expects from 0.
    assert uneven0["splits"][0][1] == uneven1["splits"][1][0]


def test_async_op_and_its_wait(everything: EverythingRun) -> None:
    for trace in everything.traces.values():
        record = next(r for r in ops(trace, api="all_reduce") if r["async"])
        (wait,) = waits_of(trace, record["id"])
        assert wait["stack"][0] == frame(everything, "async_wait", "collectives")
        assert wait["t"] >= ret_of(trace, record["id"])["t"]
        assert ret_of(trace, wait["id"])["t"] >= wait["t"]


def test_functional_collective_is_recorded_with_its_wait(everything: EverythingRun) -> None:
    for trace in everything.traces.values():
        (record,) = ops(trace, api="all_gather_tensor")
        (wait,) = waits_of(trace, record["id"])
        assert wait["stack"][0] == frame(everything, "funcol_wait", "collectives")


@pytest.mark.parametrize(
    ("api", "wire"),
    [
        ("all_gather_object", [("all_gather", "int64"), ("all_gather", "uint8")]),
        ("broadcast_object_list", [("broadcast", "int64"), ("broadcast", "uint8")]),
        ("gather_object", [("all_gather", "int64"), ("gather", "uint8")]),
        (
            "scatter_object_list",
            [("broadcast", "int64"), ("scatter", "uint8"), ("scatter", "int64")],
        ),
    ],
)
def test_object_collectives_are_recorded_as_wire_ops(
    everything: EverythingRun, api: str, wire: list[tuple[str, str]]
) -> None:
    for trace in everything.traces.values():
        found = ops(trace, api=api)
        assert [(r["op"], r["dtype"]) for r in found] == wire
        assert all(r["stack"][0][2] == "objects" for r in found)


def test_object_point_to_point(everything: EverythingRun) -> None:
    sent = ops(everything.traces[0], api="send_object_list")
    received = ops(everything.traces[1], api="recv_object_list")
    assert [(r["op"], r["peer"], r["dtype"]) for r in sent] == [
        ("send", 1, "int64"),
        ("send", 1, "uint8"),
    ]
    assert [(r["op"], r["peer"], r["count"]) for r in received] == [
        ("recv", 0, s["count"]) for s in sent
    ]


def test_send_recv(everything: EverythingRun) -> None:
    t0, t1 = everything.traces[0], everything.traces[1]
    (send,) = [r for r in ops(t0, api="send", op="send") if r["peer"] == 1]
    assert send["async"] is False
    assert send["tag"] == 0
    assert send["stack"][0] == frame(everything, "send", "point_to_point")
    (recv,) = ops(t1, api="recv", op="recv", peer=0)
    assert recv["stack"][0] == frame(everything, "recv", "point_to_point")
    assert (recv["dtype"], recv["count"], recv["tag"]) == (send["dtype"], send["count"], 0)
    (back,) = ops(t1, api="send", op="send", peer=0, tag=3)
    (back_recv,) = ops(t0, api="recv", op="recv", peer=1, tag=3)
    assert back_recv["count"] == back["count"]
    for trace, record in ((t0, send), (t1, recv)):
        (wait,) = waits_of(trace, record["id"])
        assert wait["stack"] == record["stack"]


def test_isend_irecv(everything: EverythingRun) -> None:
    (isend,) = ops(everything.traces[0], api="isend")
    (irecv,) = [r for r in ops(everything.traces[1], api="irecv") if r["peer"] == 0]
    assert isend["async"] is True and isend["peer"] == 1
    assert irecv["async"] is True
    for trace, record in ((everything.traces[0], isend), (everything.traces[1], irecv)):
        (wait,) = waits_of(trace, record["id"])
        assert wait["stack"][0] == frame(everything, "isend_wait", "point_to_point")


def test_p2p_channels_pair_up(everything: EverythingRun) -> None:
    # Per (src -> dst) channel, the i-th send of src and the i-th recv of dst agree.
    for src, dst in ((0, 1), (1, 0)):
        sends = ops(everything.traces[src], op="send", peer=dst)
        recvs = ops(everything.traces[dst], op="recv", peer=src)
        assert [r["seq"] for r in sends] == list(range(len(sends)))
        assert [r["seq"] for r in recvs] == list(range(len(recvs)))
        # Sends past the named recvs went to the wildcard recvs that name src as sender.
        wildcard = [
            r
            for r in ops(everything.traces[dst], op="recv", peer=None)
            if ret_of(everything.traces[dst], waits_of(everything.traces[dst], r["id"])[0]["id"])[
                "src"
            ]
            == src
        ]
        assert [(r["count"], r["tag"]) for r in sends] == [
            (r["count"], r["tag"]) for r in recvs + wildcard
        ]


def test_batch_isend_irecv_records_each_op(everything: EverythingRun) -> None:
    for rank, trace in everything.traces.items():
        found = ops(trace, api="batch_isend_irecv")
        assert [(r["op"], r["peer"], r["async"]) for r in found] == [
            ("send", 1 - rank, True),
            ("recv", 1 - rank, True),
        ]
        for record in found:
            assert record["stack"][0] == frame(everything, "batch", "point_to_point")
            assert record["batch"] == found[0]["id"]
            assert waits_of(trace, record["id"])
        assert not [r for r in ops(trace) if "batch" in r and r["api"] != "batch_isend_irecv"]


def test_wildcard_recv_records_the_sender(everything: EverythingRun) -> None:
    trace = everything.traces[0]
    blocking, nonblocking = ops(trace, op="recv", peer=None)
    assert blocking["api"] == "recv" and blocking["async"] is False
    assert "peer" in blocking and blocking["peer"] is None
    assert blocking["stack"][0] == frame(everything, "wildcard", "point_to_point")
    assert nonblocking["api"] == "irecv" and nonblocking["async"] is True
    for record in (blocking, nonblocking):
        (wait,) = waits_of(trace, record["id"])
        assert ret_of(trace, wait["id"])["src"] == 1
    assert everything.results[0]["wildcard_src"] == 1


def test_subgroup_members_and_non_members(everything: EverythingRun) -> None:
    member, other = everything.traces[0], everything.traces[1]
    (new0,) = [r for r in member.records if r["k"] == "newgroup"]
    (new1,) = [r for r in other.records if r["k"] == "newgroup"]
    assert new0["ranks"] == new1["ranks"] == [0]
    assert new0["gid"] == "1"
    assert new1["gid"] is None
    for record in (new0, new1):
        assert record["stack"][0] == frame(everything, "new_group", "subgroup")
    (create,) = ops(member, op="create_group", gid="1")
    assert create["ranks"] == [0] and create["api"] == "new_group"
    assert ret_of(member, create["id"])
    assert not ops(other, gid="1")
    (reduce_,) = ops(member, gid="1", op="all_reduce")
    assert reduce_["seq"] == 0
    (nonmember,) = [r for r in other.records if r["k"] == "nonmember"]
    assert nonmember["api"] == "all_reduce"
    assert nonmember["stack"][0] == frame(everything, "nonmember", "subgroup")
    assert not [r for r in member.records if r["k"] == "nonmember"]


def test_store_calls_are_recorded_and_torchs_own_are_not(everything: EverythingRun) -> None:
    seen = {}
    for rank, trace in everything.traces.items():
        stores = [r for r in trace.records if r["k"] == "store"]
        # only the script's own calls: none of init_process_group's, new_group's, ...
        expected = ["set", "get", "wait", "check"] if rank == 1 else ["get", "wait", "check"]
        assert [r["op"] for r in stores] == expected
        assert all(r["keys"] == ["ready"] for r in stores)
        get = next(r for r in stores if r["op"] == "get")
        assert get["block"] is True and get["stack"][0] == frame(
            everything, "store_get", "store_calls"
        )
        assert "err" not in ret_of(trace, get["id"])
        seen[rank] = {(r["store"], r["prefix"]) for r in stores}
    # both ranks name the same store and prefix: the key is the same key
    assert seen[0] == seen[1] and len(seen[0]) == 1
    ((store, prefix),) = seen[0]
    assert store.startswith("tcp:") and prefix.startswith("default_pg/")


def test_ddp_collectives_are_seen_with_the_backward_line(everything: EverythingRun) -> None:
    for trace in everything.traces.values():
        grads = [r for r in ops(trace, op="all_reduce", api=None) if r["async"]]
        assert len(grads) >= 2  # one bucket per step, two steps
        for record in grads:
            assert record["stack"][0] == frame(everything, "backward", "ddp_step")
            assert record["count"] == 8 * 16 + 16 + 16 * 2 + 2
        # DDP's init broadcast comes from C++ too.
        assert ops(trace, op="broadcast", api=None)
        # DDP never waits on its allreduces: they are seen complete, by a done record
        # or (when the process group is destroyed first) at least issued.
        for record in grads:
            assert ret_of(trace, record["id"])


def test_end_records(everything: EverythingRun) -> None:
    for trace in everything.traces.values():
        last = trace.records[-2:]
        assert [(r["k"], r["how"]) for r in last] == [("end", "destroy"), ("end", "exit")]


# -- torch.multiprocessing.spawn, and an unwritable run directory --------------------------


def test_spawn_children_record_through_the_bootstrap(jobs: Jobs) -> None:
    (proc,) = finish(jobs.spawn)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = traces(jobs.base / "spawn-run")
    assert sorted(found) == [0, 1]  # the parent never joins a group: no file of its own
    assert len({t.header["pid"] for t in found.values()}) == 2
    line = marks(SPAWN)["all_reduce"]
    for trace in found.values():
        (record,) = ops(trace, op="all_reduce")
        assert record["stack"][0] == [str(SPAWN), line, "worker"]
        assert trace.records[-1]["k"] == "end"
    out = jobs.base / "spawn-out"
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1] == {"all_reduce": [3.0, 3.0, 3.0]}


def test_unwritable_run_dir_job_continues_with_one_line_notice(jobs: Jobs) -> None:
    procs = finish(jobs.unwritable)
    run_dir = jobs.base / "a-file" / "run"
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, proc.stderr[-3000:]
        notices = [line for line in proc.stderr.splitlines() if line.startswith("dl2:")]
        assert notices == [
            f"dl2: recording disabled on rank {rank}: {run_dir}: Not a directory; the job continues"
        ]
        result = json.loads((jobs.base / "unwritable-out" / f"rank{rank}.json").read_text())
        assert result == {"all_reduce": [3.0, 3.0, 3.0]}


# -- a deadlocked job killed with SIGKILL --------------------------------------------------


@pytest.fixture(scope="module")
def killed(jobs: Jobs) -> dict[int, RawTrace]:
    run_dir = jobs.base / "hang-run"
    procs = jobs.hang
    try:
        deadline = time.monotonic() + 50
        while time.monotonic() < deadline:
            files = list(run_dir.glob("*.dl2.jsonl"))
            if len(files) == 2 and all(b'["q",' in f.read_bytes() for f in files):
                break
            if any(p.popen.poll() is not None for p in procs):
                break
            time.sleep(0.1)
    finally:
        for proc in reversed(procs):  # rank 1 first, mid-recv, then rank 0
            kill(proc)
        finish(procs)
    assert all(p.returncode == -signal.SIGKILL for p in procs), [p.stderr for p in procs]
    return traces(run_dir)


def test_killed_ranks_leave_readable_files(killed: dict[int, RawTrace]) -> None:
    assert sorted(killed) == [0, 1]
    for trace in killed.values():
        assert trace.truncated is None
        assert not [r for r in trace.records if r["k"] == "end"]


def test_blocked_ranks_show_their_wait_and_watchdog_state(killed: dict[int, RawTrace]) -> None:
    lines = marks(HANG)
    t0, t1 = killed[0], killed[1]
    (irecv,) = ops(t0, op="recv", peer=1)
    assert irecv["async"] is True and irecv["api"] == "irecv"
    (wait0,) = waits_of(t0, irecv["id"])
    assert wait0["stack"][0] == [str(HANG), lines["rank0_wait"], "<module>"]
    assert not [r for r in t0.records if r["k"] == "ret" and r["id"] == wait0["id"]]
    state0 = [r for r in t0.records if r["k"] == "state"][-1]
    assert state0["pending"] == [irecv["id"]]
    assert state0["where"] == "comm"
    assert state0["stack"][0] == wait0["stack"][0]

    (recv,) = ops(t1, op="recv", peer=0)
    assert recv["async"] is False and recv["api"] == "recv"
    (wait1,) = waits_of(t1, recv["id"])
    assert not [r for r in t1.records if r["k"] == "ret" and r["id"] == wait1["id"]]
    state1 = [r for r in t1.records if r["k"] == "state"][-1]
    assert state1["pending"] == [recv["id"]]  # blocking ops being waited on are pending
    assert state1["where"] == "comm"
    assert state1["stack"][0] == [str(HANG), lines["rank1_recv"], "<module>"]


# -- bounded traces: tiny segments, rotated ---------------------------------------------


def test_a_job_writes_format_2_and_rotates_its_segments(tmp_path: Path) -> None:
    # GIVEN a job of ~1,000 ops per rank recorded in 4 KiB segments, keeping 2
    from dl2.analysis import analyze
    from dl2.report import Verdict
    from dl2.trace.format import FORMAT_VERSION
    from dl2.trace.format import stream_of
    from dl2.trace.schema.decode import CheckpointRecord
    from dl2.trace.schema.decode import OpRecord
    from dl2.trace.session import load_session

    run_dir = tmp_path / "run"
    procs = []
    port = str(free_port())
    for rank in range(2):
        env = job_env(
            run_dir, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DL2_SEGMENT_BYTES="4096", DL2_KEEP="2",
        )  # fmt: skip
        procs.append(start([str(CASES / "case_rotate.py")], env))
    finish(procs)
    assert all(p.returncode == 0 for p in procs), [p.stderr[-2000:] for p in procs]
    # THEN each rank kept its 2 newest segments, of format 2
    for rank in range(2):
        files = sorted(run_dir.glob(f"rank{rank:05d}.*"))
        numbers = [stream_of(f.name)[1] for f in files]
        assert len(files) == 2 and numbers[0] > 2 and numbers[1] == numbers[0] + 1
        assert all(json.loads(f.open().readline())["format"] == FORMAT_VERSION for f in files)
        assert all(f.stat().st_size < 4096 + 1024 for f in files)
    # AND the run reads back from each rank's checkpoint on, and analyses as a clean run
    session = load_session(run_dir)
    assert session.rotated_ranks() == [0, 1]
    loop = marks(CASES / "case_rotate.py")["loop"]
    for trace in session.traces.values():
        cp, *rest = trace.records
        assert isinstance(cp, CheckpointRecord)
        ops = [r for r in rest if isinstance(r, OpRecord)]
        seqs = [op.seq for op in ops if op.gid == "0" and op.op in ("all_reduce", "barrier")]
        assert seqs == list(range(cp.collectives["0"], cp.collectives["0"] + len(seqs)))
        assert any(op.stack and op.stack[0].line == loop for op in ops)
        assert [r.kind for r in rest[-2:]] == ["end", "end"]
    report = analyze(session)
    assert report.verdict is Verdict.OK, report.findings


def test_dl2_run_finds_a_deadlock_after_rotation(tmp_path: Path, dl2_bin: Path) -> None:
    # GIVEN the same job ending in a send/send deadlock, under dl2 run with 4 KiB segments
    run_dir = tmp_path / "run"
    out = tmp_path / "report.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", ROTATE_DEADLOCK="1", PYTHONWARNINGS="ignore")
    command = [str(dl2_bin), "run", "--run-dir", str(run_dir), "--segment-size", "4096"]
    command += ["--keep", "2", "--json", str(out), "-n", "2", str(CASES / "case_rotate.py")]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, start_new_session=True
    )
    # THEN the live monitor proves it on the rotated traces, naming the send lines
    assert done.returncode == 3, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["verdict"] == "deadlock"
    line = marks(CASES / "case_rotate.py")["deadlock"]
    deadlock = next(f for f in report["findings"] if f["kind"] == "deadlock")
    assert [(o["op"], o["line"]) for o in deadlock["ops"]] == [("send", line), ("send", line)]
    assert len(list(run_dir.glob("rank00000.*"))) <= 2
    # AND the commands that need the whole history refuse it, saying how to keep it
    predict = subprocess.run(
        [str(dl2_bin), "predict", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert predict.returncode == 2 and "--keep all" in predict.stderr


def test_the_c_and_the_python_recorder_write_the_same_trace(tmp_path: Path) -> None:
    # GIVEN the many-op job recorded twice: with dl2._speedups, and with DL2_PURE_PYTHON=1
    from dl2 import speedups

    if not speedups.active():
        pytest.skip("dl2._speedups is not in use here (DL2_PURE_PYTHON, or not built)")

    def record(name: str, **extra: str) -> dict[int, RawTrace]:
        run_dir = tmp_path / name
        port = str(free_port())
        procs = [
            start(
                [str(CASES / "case_rotate.py")],
                job_env(
                    run_dir,
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE="2",
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=port,
                    **extra,
                ),
            )
            for rank in range(2)
        ]
        finish(procs)
        assert all(p.returncode == 0 for p in procs), [p.stderr[-2000:] for p in procs]
        return traces(run_dir)

    fast, pure = record("c"), record("python", DL2_PURE_PYTHON="1")

    # THEN each rank's ops and waits are the same records, times and thread ids aside
    # (async completions are seen when they happen to be, so done records may differ)
    def shape(trace: RawTrace) -> list[tuple[Any, ...]]:
        return [
            tuple(sorted((k, str(v)) for k, v in r.items() if k not in ("t", "dur", "tid")))
            for r in trace.records
            if r["k"] in ("op", "wait")
        ]

    for rank in range(2):
        assert len(shape(fast[rank])) > 600
        assert shape(fast[rank]) == shape(pure[rank])


def test_a_helper_thread_that_dies_is_recorded_and_reported(tmp_path: Path) -> None:
    # GIVEN a job whose rank 1 loses a helper thread to a KeyError, then ends cleanly
    from dl2.analysis import analyze
    from dl2.report import Verdict
    from dl2.trace.session import load_session

    script = CASES / "case_thread_dies.py"
    procs = launch_env_job(script, tmp_path / "run", tmp_path)
    finish(procs)
    assert all(p.returncode == 0 for p in procs), [p.stderr[-2000:] for p in procs]
    # THEN the thread still printed its traceback (the hook there was still runs)
    assert "KeyError: 'acc'" in procs[1].stderr
    # AND rank 1's trace says which thread died, of what, where
    (died,) = [r for r in traces(tmp_path / "run")[1].records if r["k"] == "thread_error"]
    assert (died["name"], died["err"]) == ("metrics", "KeyError: 'acc'")
    assert died["stack"][0] == [str(script), marks(script)["raise"], "helper"]
    # AND the analysis warns of it
    report = analyze(load_session(tmp_path / "run"))
    assert report.verdict is Verdict.OK
    line = marks(script)["raise"]
    assert (
        f"rank 1's thread 'metrics' ended with an uncaught KeyError: 'acc', raised at "
        f"case_thread_dies.py:{line} in helper" in report.warnings
    )
