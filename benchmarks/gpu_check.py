"""The GPU check (``make gpu-check``): dl2 on CUDA tensors, NCCL groups and a Flight
Recorder dump taken from a CUDA build.  One GPU, under 5 minutes.

Run from the repository root, with no install::

    PYTHONPATH=src python3 benchmarks/gpu_check.py

Without a CUDA device it prints why it skips and exits 0.  Otherwise it runs, each step
with a hard timeout, and goes on after a failed step:

1. ``gloo-cuda-order``: ``dl2 run -n 2`` on a gloo job whose tensors are on cuda:0 and
   whose ranks call all_reduce on two groups in opposite orders: dl2 must prove the
   deadlock (exit 3, ranks 0 and 1, the all_reduce line of each);
2. ``gloo-cuda-ok``: the same job in one order: verdict ok;
3. ``nccl-1rank``: ``dl2 run -n 1`` on an NCCL job (sync and async all_reduce, broadcast,
   barrier): verdict ok, the world group is dl2's recording group in front of NCCL, and
   the trace holds the ops (NCCL puts one rank per GPU: one GPU, one rank);
4. ``mixed-1rank``: the same with ``backend="cpu:gloo,cuda:nccl"``, a CPU and a CUDA
   tensor;
5. ``fr-dump``: a 1-rank NCCL job with ``TORCH_FR_BUFFER_SIZE=2000`` (and the legacy
   ``TORCH_NCCL_TRACE_BUFFER_SIZE``) runs a few collectives, then writes
   ``_dump_nccl_trace()`` (pickle) to ``fr-pickle/nccl_trace_rank_0`` and
   ``_dump_nccl_trace_json()`` to ``fr-json/nccl_trace_rank_0.json``;
6. ``fr-analyze``: ``dl2 analyze`` on each of those directories (where dl2 cannot read
   them, its one-line error is printed and the step fails; the dumps stay on disk).

``DL2_GPU_CHECK_DRY=1`` runs steps 1 and 2 on CPU tensors where there is no GPU (a
check of this script itself, for the test suite).

Everything (``gpu_check.log``, the run directories, the dumps) goes under ``$OUT`` when
it is set, else under ``dl2-gpu-check/``.  Exit status: 0 when every step passed (or
skipped), 1 when any failed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
OUT = Path(os.environ.get("OUT") or "dl2-gpu-check").resolve()
LOG = OUT / "gpu_check.log"
#: hard limit of one step's command, seconds
STEP_TIMEOUT_S = 150
#: dl2 run's --hang-timeout: a verdict must come from the analysis long before this
HANG_TIMEOUT_S = 60


def say(text: str = "") -> None:
    print(text, flush=True)
    try:
        with LOG.open("a") as log:
            log.write(text + "\n")
    except OSError:
        pass


def env_for_jobs(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``cmd`` in its own session, killed (with all it started) past ``timeout``."""
    say("$ " + " ".join(cmd))
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        env=env or env_for_jobs(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=str(OUT),
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, _ = proc.communicate()
        code = -999
        say(f"  TIMEOUT after {timeout:.0f} s: killed")
    text = out.decode(errors="replace")
    for line in text.splitlines()[-40:]:
        say("  | " + line)
    say(f"  exit {code} after {time.monotonic() - started:.1f} s")
    return code, text


def dl2(*args: str) -> list[str]:
    return [sys.executable, "-m", "dl2", *args]


def dl2_run(run_dir: Path, nproc: int, job: Path) -> list[str]:
    """``dl2 run`` of ``nproc`` ranks of ``job`` into ``run_dir``."""
    hang = str(HANG_TIMEOUT_S)
    return dl2("run", "--run-dir", str(run_dir), "--hang-timeout", hang, "-n", str(nproc), str(job))


# -- the jobs ----------------------------------------------------------------------------

ORDER_JOB = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
a = dist.new_group([0, 1])
b = dist.new_group([0, 1])
t = torch.ones(1024, device=os.environ.get("JOB_DEVICE", "cuda:0"))
if os.environ.get("JOB_SAME_ORDER") or rank == 0:
    first, second = a, b
else:
    first, second = b, a
dist.all_reduce(t, group=first)  # LINE first
dist.all_reduce(t, group=second)
if t.is_cuda:
    torch.cuda.synchronize()
assert t.device.type == os.environ.get("JOB_DEVICE", "cuda")[:4] and t[0].item() == 4.0, t
print(f"rank {rank} ok", flush=True)
dist.destroy_process_group()
"""

NCCL_JOB = """
import os
import torch
import torch.distributed as dist

backend = os.environ["JOB_BACKEND"]
dist.init_process_group(backend, device_id=torch.device("cuda:0"))
world = dist.group.WORLD
print("world group:", type(world).__name__, "backend:", dist.get_backend(), flush=True)
t = torch.ones(1 << 20, device="cuda:0")
for _ in range(5):
    dist.all_reduce(t)
work = dist.all_reduce(t, async_op=True)
work.wait()
dist.broadcast(t, src=0)
if backend != "nccl":
    c = torch.ones(16)
    dist.all_reduce(c)  # the CPU tensor goes to gloo
    assert c[0].item() == 1.0, c
dist.barrier()
torch.cuda.synchronize()
assert t[0].item() == 1.0, t
print("nccl job ok", flush=True)
dist.destroy_process_group()
"""

FR_JOB = """
import os
import sys
import torch
import torch.distributed as dist
import torch._C._distributed_c10d as c10d

out = sys.argv[1]
dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
t = torch.ones(4096, device="cuda:0")
for _ in range(3):
    dist.all_reduce(t)
dist.broadcast(t, src=0)
g = dist.new_group([0])
dist.all_reduce(t, group=g)
dist.barrier()
torch.cuda.synchronize()
dumps = (
    ("_dump_nccl_trace", "fr-pickle", "nccl_trace_rank_0", "wb"),
    ("_dump_nccl_trace_json", "fr-json", "nccl_trace_rank_0.json", "w"),
)
for name, folder, file, mode in dumps:
    fn = getattr(c10d, name, None)
    if fn is None:
        print(f"torch has no {name} in this build", flush=True)
        continue
    data = fn()
    if isinstance(data, str):  # the JSON form: str in some releases, bytes in 2.11
        data = data.encode()
    os.makedirs(os.path.join(out, folder), exist_ok=True)
    with open(os.path.join(out, folder, file), "wb") as f:
        f.write(data)
    print(f"{name}: {len(data)} {'bytes' if mode == 'wb' else 'chars'} written", flush=True)
dist.destroy_process_group()
"""


def write_job(name: str, text: str) -> Path:
    path = OUT / "jobs" / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def line_of(path: Path, mark: str) -> int:
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if text.endswith(f"# LINE {mark}"):
            return number
    raise AssertionError(mark)


def run_meta(run_dir: Path) -> dict[str, object]:
    try:
        meta: dict[str, object] = json.loads((run_dir / "run.json").read_text())
        return meta
    except (OSError, ValueError) as err:
        raise AssertionError(f"no readable run.json in {run_dir}: {err}") from err


# -- the steps ---------------------------------------------------------------------------


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


def step_gloo_cuda_order() -> None:
    job = write_job("gloo_cuda_order", ORDER_JOB)
    run_dir = OUT / "runs" / "gloo-cuda-order"
    code, _ = run(
        dl2_run(run_dir, 2, job),
        STEP_TIMEOUT_S,
    )
    meta = run_meta(run_dir)
    check(code == 3, f"dl2 run exited {code}, expected 3 (deadlock)")
    check(meta.get("verdict") == "deadlock", f"verdict {meta.get('verdict')!r}")
    check(meta.get("deadlock_ranks") == [0, 1], f"deadlock ranks {meta.get('deadlock_ranks')}")
    report = json.loads((run_dir / "report.json").read_text())
    findings = [f for f in report["findings"] if f["kind"] == "deadlock"]
    check(len(findings) == 1, f"{len(findings)} deadlock findings")
    line = line_of(job, "first")
    lines = {(op["rank"], op["line"]) for op in findings[0]["ops"]}
    check(lines == {(0, line), (1, line)}, f"ops at {sorted(lines)}, expected line {line}")
    say(f"  deadlock proven after {meta.get('detected_after')} s, ranks 0 and 1 at line {line}")


def step_gloo_cuda_ok() -> None:
    job = write_job("gloo_cuda_order", ORDER_JOB)
    run_dir = OUT / "runs" / "gloo-cuda-ok"
    code, text = run(
        dl2_run(run_dir, 2, job),
        STEP_TIMEOUT_S,
        env_for_jobs({"JOB_SAME_ORDER": "1"}),
    )
    check(code == 0, f"dl2 run exited {code}, expected 0")
    check(run_meta(run_dir).get("verdict") == "ok", "verdict is not ok")
    check("rank 0 ok" in text and "rank 1 ok" in text, "the job did not finish on both ranks")


def _nccl_step(name: str, backend: str) -> None:
    job = write_job("nccl_job", NCCL_JOB)
    run_dir = OUT / "runs" / name
    code, text = run(
        dl2_run(run_dir, 1, job),
        STEP_TIMEOUT_S,
        env_for_jobs({"JOB_BACKEND": backend}),
    )
    check(code == 0, f"dl2 run exited {code}, expected 0")
    check(run_meta(run_dir).get("verdict") == "ok", "verdict is not ok")
    check("nccl job ok" in text, "the job did not finish")
    check(
        "world group: DeviceRecordingGroup" in text,
        "the world group is not dl2's recording group (the NCCL group was not wrapped)",
    )
    traces = sorted(run_dir.glob("rank00000.*.dl2.jsonl"))
    check(bool(traces), "no trace file")
    trace = traces[0].read_text()
    header = json.loads(trace.splitlines()[0])
    check(header.get("backend") == backend, f"trace header backend {header.get('backend')!r}")
    for op in ('"op":"all_reduce"', '"op":"broadcast"', '"op":"barrier"'):
        check(op in trace, f"{op} not in the trace")
    say(f"  {backend} group wrapped and recorded; verdict ok")


def step_nccl_1rank() -> None:
    _nccl_step("nccl-1rank", "nccl")


def step_mixed_1rank() -> None:
    _nccl_step("mixed-1rank", "cpu:gloo,cuda:nccl")


def step_fr_dump() -> None:
    job = write_job("fr_job", FR_JOB)
    env = env_for_jobs(
        {
            "TORCH_FR_BUFFER_SIZE": "2000",
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(29500 + os.getpid() % 1000),
            "DL2_DISABLE": "1",
        }
    )
    code, _ = run([sys.executable, str(job), str(OUT)], STEP_TIMEOUT_S, env)
    check(code == 0, f"the FR job exited {code}")
    pickled = OUT / "fr-pickle" / "nccl_trace_rank_0"
    as_json = OUT / "fr-json" / "nccl_trace_rank_0.json"
    check(pickled.exists() and pickled.stat().st_size > 0, f"{pickled} missing or empty")
    check(as_json.exists() and as_json.stat().st_size > 0, f"{as_json} missing or empty")
    try:
        doc = json.loads(as_json.read_text())
        say(
            f"  FR json: version {doc.get('version')!r}, {len(doc.get('entries', []))} entries, "
            f"groups {sorted(doc.get('pg_config', {}))}"
        )
    except ValueError as err:
        say(f"  FR json does not parse: {err}")


def step_fr_analyze() -> None:
    failures = []
    for folder in ("fr-pickle", "fr-json"):
        path = OUT / folder
        if not path.exists():
            failures.append(f"{folder}: no dump to analyse")
            continue
        code, text = run(
            dl2("analyze", "--json", str(OUT / f"{folder}-report.json"), str(path)),
            STEP_TIMEOUT_S,
        )
        if code not in (0, 3):
            last = next((x for x in reversed(text.splitlines()) if x.strip()), "")
            say(f"  dl2 analyze could not read {folder}: {last}")
            failures.append(f"{folder}: dl2 analyze exited {code}")
    check(not failures, "; ".join(failures))


STEPS: list[tuple[str, Callable[[], None], bool]] = [
    # (name, step, needs dl2's CLI)
    ("gloo-cuda-order", step_gloo_cuda_order, True),
    ("gloo-cuda-ok", step_gloo_cuda_ok, True),
    ("nccl-1rank", step_nccl_1rank, True),
    ("mixed-1rank", step_mixed_1rank, True),
    ("fr-dump", step_fr_dump, False),
    ("fr-analyze", step_fr_analyze, True),
]


def _describe_device() -> None:
    import torch
    import torch.distributed as dist

    say(f"device: {torch.cuda.get_device_name(0)}; NCCL available: {dist.is_nccl_available()}")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    say(f"dl2 GPU check: output in {OUT}")
    say(f"python {platform.python_version()} at {sys.executable}")
    try:
        import torch
    except Exception as err:  # no torch: nothing on a GPU to check
        say(f"SKIP: torch cannot be imported ({err!r}); the GPU check needs torch with CUDA")
        return 0
    cuda = False
    try:
        cuda = bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception as err:
        say(f"torch.cuda failed: {err!r}")
    say(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, CUDA available: {cuda}")
    steps = STEPS
    if not cuda:
        if os.environ.get("DL2_GPU_CHECK_DRY") != "1":
            say("SKIP: no CUDA device here (torch.cuda.is_available() is False): nothing to check")
            return 0
        say("dry run: the gloo steps on CPU tensors (DL2_GPU_CHECK_DRY=1)")
        os.environ["JOB_DEVICE"] = "cpu"
        steps = STEPS[:2]
    else:
        _describe_device()
    missing = [m for m in ("msgspec", "rich") if importlib.util.find_spec(m) is None]
    if missing:
        say(
            f"dl2's CLI needs {' and '.join(missing)}, not importable by {sys.executable}: "
            f"`{sys.executable} -m pip install {' '.join(missing)}` (or a wheel); the steps "
            "that run dl2 fail, the FR dump is still taken"
        )
    results: list[tuple[str, str]] = []
    started = time.monotonic()
    for name, step, needs_cli in steps:
        say()
        say(f"== {name}")
        if needs_cli and missing:
            results.append((name, f"FAIL: {' and '.join(missing)} missing"))
            say(f"  FAIL: needs {' and '.join(missing)}")
            continue
        try:
            step()
            results.append((name, "ok"))
            say("  ok")
        except Exception as err:
            results.append((name, f"FAIL: {err}"))
            say(f"  FAIL: {err}")
    say()
    say(f"== summary ({time.monotonic() - started:.0f} s)")
    for name, outcome in results:
        say(f"  {name:<16} {outcome}")
    failed = [name for name, outcome in results if outcome != "ok"]
    say("GPU check: " + (f"{len(failed)} step(s) failed" if failed else "all steps passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
