"""``dl2 run`` on jobs whose groups are not gloo (the path of NCCL and mixed backends).

The jobs use the custom backends of ``fakenccl.py``: "fakenccl" (gloo underneath, NCCL's
completion semantics: ops of a process run in order on one stream and ``wait()``
returns at once) and "cxxgloo" (torch's ProcessGroupGloo returned by a custom creator,
so torch builds a C++ group around it, as it does for NCCL).  Each deadlock must be
proven live with its ranks and lines, each correct twin must pass; every run has a hard
timeout.
"""

from __future__ import annotations

import json
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_online import Run
from test_online import dl2_run

HERE = Path(__file__).resolve().parent

JOB_HEAD = f"""
import os, sys
sys.path.insert(0, {str(HERE)!r})
import torch
import torch.distributed as dist
import fakenccl

fakenccl.register()
BACKEND = os.environ["JOB_BACKEND"]
dist.init_process_group(BACKEND)
rank = dist.get_rank()
peer = 1 - rank
out = torch.full((4,), float(rank))
into = torch.empty(4)
"""

JOBS = {
    # both ranks send first: each send waits for a receive queued behind the peer's send
    "sendsend": """
dist.send(out, dst=peer)  # LINE send
dist.recv(into, src=peer)
fakenccl.synchronize()
""",
    # two groups, all_reduce in opposite orders
    "order": """
a = dist.new_group([0, 1], backend=BACKEND)
b = dist.new_group([0, 1], backend=BACKEND)
first, second = (a, b) if rank == 0 else (b, a)
dist.all_reduce(out, group=first)  # LINE first
dist.all_reduce(out, group=second)
fakenccl.synchronize()
""",
    # the correct twin: ordered send/recv, async ops waited on, collectives in one order
    "ok": """
a = dist.new_group([0, 1], backend=BACKEND)
if rank == 0:
    dist.send(out, dst=peer)
    dist.recv(into, src=peer)
else:
    dist.recv(into, src=peer)
    dist.send(out, dst=peer)
work = dist.all_reduce(out, group=a, async_op=True)
work.wait()
dist.all_reduce(out)
dist.barrier()
fakenccl.synchronize()
assert into[0].item() == float(peer), into
assert out[0].item() == 2.0, out
print(f"rank {rank} done", flush=True)
# torch's gloo groups left to interpreter teardown abort now and then under load
# ("terminate called without an active exception", status -6): a job that ends so
# failed, and dl2 says so; this correct job ends cleanly
dist.destroy_process_group()
""",
}

#: (name, job, backend, extra environment)
RUNS = [
    ("sendsend-fakenccl", "sendsend", "fakenccl", {}),
    ("sendsend-blocking", "sendsend", "fakenccl", {"FAKENCCL_BLOCKING": "1"}),
    ("sendsend-cxxgloo", "sendsend", "cxxgloo", {}),
    ("order-fakenccl", "order", "fakenccl", {}),
    ("order-mixed", "order", "cpu:gloo,cuda:fakenccl", {}),
    ("ok-fakenccl", "ok", "fakenccl", {}),
    ("ok-blocking", "ok", "fakenccl", {"FAKENCCL_BLOCKING": "1"}),
    ("ok-cxxgloo", "ok", "cxxgloo", {}),
]


def _line(job: str, mark: str) -> int:
    source = JOB_HEAD + textwrap.dedent(JOBS[job])
    for number, text in enumerate(source.splitlines(), 1):
        if text.endswith(f"# LINE {mark}"):
            return number
    raise AssertionError(mark)


@pytest.fixture(scope="module")
def runs(dl2_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("device")
    for job, body in JOBS.items():
        (root / f"{job}.py").write_text(JOB_HEAD + textwrap.dedent(body))

    def one(spec: tuple[str, str, str, dict[str, str]]) -> tuple[str, Run]:
        name, job, backend, env = spec
        args = ["--hang-timeout", "30", "-n", "2", str(root / f"{job}.py")]
        extra = dict(env, JOB_BACKEND=backend)
        # (torch's abort at teardown: dl2_run runs the job once more)
        return name, dl2_run(dl2_bin, root / name, args, env=extra)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, RUNS))


def _trace_ops(run: Run, rank: int) -> str:
    (path,) = run.run_dir.glob(f"rank{rank:05d}.*.dl2.jsonl")
    return path.read_text()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", ["sendsend-fakenccl", "sendsend-blocking", "sendsend-cxxgloo"])
def test_send_send_deadlock_is_proven(runs: dict[str, Run], name: str) -> None:
    run = runs[name]
    assert run.returncode == 3, run.output
    assert run.meta["verdict"] == "deadlock" and run.meta["reason"] == "deadlock"
    (finding,) = [f for f in run.report["findings"] if f["kind"] == "deadlock"]
    assert finding["ranks"] == [0, 1]
    line = _line("sendsend", "send")
    assert {(op["rank"], op["op"], op["line"]) for op in finding["ops"]} == {
        (0, "send", line),
        (1, "send", line),
    }


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", ["order-fakenccl", "order-mixed"])
def test_collectives_in_different_orders_are_proven(runs: dict[str, Run], name: str) -> None:
    run = runs[name]
    assert run.returncode == 3, run.output
    assert run.meta["verdict"] == "deadlock" and run.meta["reason"] == "deadlock"
    (finding,) = [f for f in run.report["findings"] if f["kind"] == "deadlock"]
    assert finding["ranks"] == [0, 1]
    line = _line("order", "first")
    ops: list[dict[str, Any]] = finding["ops"]
    assert {(op["rank"], op["line"]) for op in ops} == {(0, line), (1, line)}
    assert {op["group"] for op in ops} == {"1", "2"}  # one rank on each group


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", ["ok-fakenccl", "ok-blocking", "ok-cxxgloo"])
def test_correct_job_passes_and_is_recorded(runs: dict[str, Run], name: str) -> None:
    run = runs[name]
    assert run.returncode == 0, run.output
    assert run.meta["verdict"] == "ok"
    assert run.report["verdict"] == "ok"
    assert "rank 0 done" in run.output and "rank 1 done" in run.output
    for rank in (0, 1):
        text = _trace_ops(run, rank)
        header = json.loads(text.splitlines()[0])
        assert header["backend"] == run.run_dir.name.split("-")[1].replace("blocking", "fakenccl")
        # the non-gloo group was recorded: its ops are in the trace
        for op in ('"op":"send"', '"op":"recv"', '"op":"all_reduce"', '"op":"barrier"'):
            assert op in text, (rank, op)
