"""Nondeterminism end to end: eager-send emulation, prediction and replay on real gloo jobs.

Three programs (``replay_cases/``), each with a correct twin:

* ``sendsend.py N``: both ranks send N bytes first.  Recorded with ``dl2 run
  --buffer-size N`` it completes; ``dl2 predict`` finds that it deadlocks exactly when
  the eager buffer is below N, and ``dl2 replay`` deadlocks below N and passes at N.
* ``wildcard.py``: rank 0 receives from any rank, then from rank 2; the recorded run
  took the clean order (rank 2 sends late), the prediction finds the other match, and
  replaying the witness deadlocks.
* ``batches.py``: 5 sends in one batch, received as a batch of 4 then 1: flagged under
  NCCL's fused batches, clean under gloo; the replay of the NCCL witness (fused-batch
  emulation) deadlocks.

Every witness ``dl2 predict`` writes for these recordings is replayed and must deadlock.
Launches run two at a time; every process has a hard timeout and is killed by its
process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from trace_builders import read_raw_trace

CASES = Path(__file__).resolve().parent / "replay_cases"
#: bytes each rank of sendsend.py sends
NBYTES = 4096
#: the hard limit of one dl2 command (its processes are killed past it)
COMMAND_TIMEOUT_S = 90
#: dl2's own limit on a replay that hangs without proof
HANG_TIMEOUT_S = "20"

pytestmark = pytest.mark.timeout(240)


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str
    run_dir: Path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    for name in ("DL2_RUN_DIR", "DL2_BUFFER_SIZE", "DL2_FUSED_BATCHES", "DL2_DISABLE"):
        env.pop(name, None)
    return env


def dl2(dl2_bin: Path, *args: str, run_dir: Path, cwd: Path) -> Result:
    """Run one dl2 command in its own process group, killed after COMMAND_TIMEOUT_S."""
    proc = subprocess.Popen(
        [str(dl2_bin), *args],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"dl2 {' '.join(args)} ran past {COMMAND_TIMEOUT_S} s:\n{stdout}\n{stderr}")
    return Result(proc.returncode, stdout, stderr, run_dir)


@dataclass(frozen=True)
class Lab:
    """The dl2 executable and a scratch directory shared by the module's tests."""

    dl2_bin: Path
    root: Path

    def record(self, name: str, world: int, script: str, *args: str, buffer: int | None) -> Result:
        run_dir = self.root / name
        options = ["--buffer-size", str(buffer)] if buffer is not None else []
        return dl2(
            self.dl2_bin,
            "run",
            "--hang-timeout",
            HANG_TIMEOUT_S,
            "--run-dir",
            str(run_dir),
            *options,
            "-n",
            str(world),
            str(CASES / script),
            *args,
            run_dir=run_dir,
            cwd=self.root,
        )

    def replay(self, name: str, recorded: Path, *options: str) -> Result:
        run_dir = self.root / name
        return dl2(
            self.dl2_bin,
            "replay",
            str(recorded),
            "--hang-timeout",
            HANG_TIMEOUT_S,
            "--run-dir",
            str(run_dir),
            *options,
            run_dir=run_dir,
            cwd=self.root,
        )

    def predict(self, recorded: Path, *options: str) -> tuple[Result, dict[str, object]]:
        out = self.root / f"predict-{recorded.name}-{abs(hash(options))}.json"
        result = dl2(
            self.dl2_bin,
            "predict",
            str(recorded),
            "--json",
            str(out),
            *options,
            run_dir=recorded,
            cwd=self.root,
        )
        return result, json.loads(out.read_text())


@pytest.fixture(scope="module")
def lab(dl2_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return Lab(dl2_bin, tmp_path_factory.mktemp("replay"))


#: name -> (ranks, script and args, --buffer-size)
RECORDINGS: dict[str, tuple[int, tuple[str, ...], int | None]] = {
    "sendsend": (2, ("sendsend.py", str(NBYTES)), NBYTES),
    "sendsend-below": (2, ("sendsend.py", str(NBYTES)), NBYTES - 1),
    "sendsend-twin": (2, ("sendsend.py", str(NBYTES), "twin"), None),
    "wildcard": (3, ("wildcard.py",), None),
    "wildcard-twin": (3, ("wildcard.py", "twin"), None),
    "batches": (2, ("batches.py",), None),
    "batches-twin": (2, ("batches.py", "twin"), None),
}


@pytest.fixture(scope="module")
def recorded(lab: Lab) -> dict[str, Result]:
    """Every recording of the module, two at a time."""

    def one(name: str) -> Result:
        world, (script, *args), buffer = RECORDINGS[name]
        return lab.record(name, world, script, *args, buffer=buffer)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(RECORDINGS, pool.map(one, RECORDINGS), strict=True))


def _witnesses(document: dict[str, object]) -> list[dict[str, object]]:
    configurations = document["configurations"]
    assert isinstance(configurations, list)
    return [w for c in configurations for w in c["witnesses"]]


# -- eager-send emulation ---------------------------------------------------------------------


def test_send_send_completes_with_a_buffer_it_fits(recorded: dict[str, Result]) -> None:
    # GIVEN both ranks send 4096 bytes first, WHEN run with a 4096-byte buffer THEN it
    # completes, and the report says it relies on the buffer (a hazard: exit 4)
    result = recorded["sendsend"]
    assert result.code == 4, result.stdout + result.stderr
    assert "Deadlocks when sends of 4,096 bytes or more are not buffered" in " ".join(
        result.stdout.split()
    )
    traces = [read_raw_trace(path) for path in sorted(result.run_dir.glob("*.dl2.jsonl"))]
    header = traces[0].header
    assert header["emulate"] == {"eager_bytes": NBYTES, "fused_batches": False}
    records = [r for trace in traces for r in trace.records]
    sends = [r for r in records if r.get("k") == "op" and r.get("op") == "send"]
    assert len(sends) == 2 and all(r["eager"] for r in sends)


def test_send_send_deadlocks_with_a_buffer_one_byte_short(recorded: dict[str, Result]) -> None:
    result = recorded["sendsend-below"]
    assert result.code == 3, result.stdout + result.stderr
    assert "DEADLOCK" in result.stdout
    assert "sendsend.py:23" in result.stdout  # the send line


# -- send/send: prediction threshold and replay -----------------------------------------------


def test_send_send_predicted_to_deadlock_exactly_below_its_size(
    lab: Lab, recorded: dict[str, Result]
) -> None:
    run_dir = recorded["sendsend"].run_dir
    sizes = f"0,{NBYTES - 1},{NBYTES},{NBYTES + 1}"
    result, document = lab.predict(run_dir, "--semantics", "eager:0", "--buffer-sizes", sizes)
    assert result.code == 4, result.stdout
    verdicts = {
        c["semantics"]["eager_bytes"]: c["deadlock"]  # type: ignore[index]
        for c in document["configurations"]  # type: ignore[attr-defined]
    }
    assert verdicts == {0: True, NBYTES - 1: True, NBYTES: False, NBYTES + 1: False}
    assert {w["threshold"] for w in _witnesses(document)} == {NBYTES}


def test_send_send_replay_deadlocks_below_the_threshold_and_passes_at_it(
    lab: Lab, recorded: dict[str, Result]
) -> None:
    run_dir = recorded["sendsend"].run_dir
    with ThreadPoolExecutor(max_workers=2) as pool:
        below, at = pool.map(
            lambda size: lab.replay(f"replay-sendsend-{size}", run_dir, "--buffer-size", size),
            [str(NBYTES - 1), str(NBYTES)],
        )
    assert below.code == 3, below.stdout + below.stderr
    assert "forced sends: rendezvous" not in below.stdout
    assert "4,095 bytes" in below.stdout
    assert "sendsend.py:23" in below.stdout  # reported at the recorded program's line
    assert at.code == 0, at.stdout + at.stderr
    assert "verdict ok" in at.stdout


# -- wildcard race and batches: predicted from clean runs -------------------------------------


def test_wildcard_race_predicted_from_a_clean_run(lab: Lab, recorded: dict[str, Result]) -> None:
    record = recorded["wildcard"]
    assert record.code == 4, record.stdout + record.stderr  # completed; potential deadlock
    assert "potential-deadlock" in record.stdout
    result, document = lab.predict(record.run_dir, "--semantics", "gloo")
    assert result.code == 4
    (witness,) = _witnesses(document)
    choice = witness["choices"][0]  # type: ignore[index]
    assert (choice["rank"], choice["sender"], choice["recorded_sender"]) == (0, 2, 1)


def test_split_batches_flagged_under_nccl_and_clean_under_gloo(
    lab: Lab, recorded: dict[str, Result]
) -> None:
    run_dir = recorded["batches"].run_dir
    nccl, document = lab.predict(run_dir, "--semantics", "nccl")
    assert nccl.code == 4
    (witness,) = _witnesses(document)
    assert "batch" in witness["causes"]  # type: ignore[operator]
    gloo, _ = lab.predict(run_dir, "--semantics", "gloo")
    assert gloo.code == 0, gloo.stdout


@pytest.mark.parametrize("twin", ["sendsend-twin", "wildcard-twin", "batches-twin"])
def test_correct_twins_clean_under_every_configuration(
    lab: Lab, recorded: dict[str, Result], twin: str
) -> None:
    record = recorded[twin]
    assert record.code == 0, record.stdout + record.stderr
    specs = ["gloo", "nccl", "nccl:0", "nccl:1KiB", "eager:0", "eager:64KiB", "gloo+serial"]
    options = [arg for spec in specs for arg in ("--semantics", spec)]
    result, document = lab.predict(record.run_dir, *options, "--buffer-sizes", "0,1,4KiB,4MiB")
    assert result.code == 0, result.stdout
    assert not _witnesses(document)


# -- every witness replays to a deadlock ------------------------------------------------------


def test_every_witness_replays_to_a_deadlock(lab: Lab, recorded: dict[str, Result]) -> None:
    jobs: list[tuple[str, Path, str]] = []
    for name in ("sendsend", "wildcard", "batches"):
        result, document = lab.predict(recorded[name].run_dir)
        assert result.code == 4, result.stdout
        for number, witness in enumerate(_witnesses(document)):
            jobs.append((f"{name}-{number}", recorded[name].run_dir, str(witness["file"])))
    assert {job[0].split("-")[0] for job in jobs} == {"sendsend", "wildcard", "batches"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(
            pool.map(lambda job: lab.replay(f"witness-{job[0]}", job[1], "--choices", job[2]), jobs)
        )
    for (name, _, path), result in zip(jobs, results, strict=True):
        assert result.code == 3, f"{name} ({path}):\n{result.stdout}\n{result.stderr}"
        assert "the witness's deadlock reproduces" in result.stdout
