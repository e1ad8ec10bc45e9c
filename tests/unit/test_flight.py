"""Flight Recorder dumps: safe loading (fuzzed), schema, and the mapping onto dl2's model.

The dumps are built field for field as PyTorch writes them (``tests/fr_builders.py``);
each case asserts the verdict, the ranks and the source lines, and its correct twin.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dl2.analysis import analyze
from dl2.errors import Dl2Error
from dl2.flight.loader import is_flight_input
from dl2.flight.loader import load_flight_session
from dl2.flight.safe import PICKLE
from dl2.flight.safe import FlightDumpError
from dl2.flight.safe import loads
from dl2.report import FindingKind
from dl2.report import Report
from dl2.report import Verdict
from fr_builders import SCRIPT
from fr_builders import RankDump
from fr_builders import world


def _report(tmp: Path, ranks: list[RankDump], form: str = "pickle", **kw: object) -> Report:
    for r in ranks:
        (r.write_pickle if form == "pickle" else r.write_json)(tmp, **kw)  # type: ignore[arg-type]
    return analyze(load_flight_session([tmp]))


def _cycle(report: Report) -> tuple[tuple[int, ...], list[tuple[int, str, int | None]]]:
    [finding] = [f for f in report.findings if f.kind is FindingKind.DEADLOCK]
    return finding.ranks, [(o.rank, o.group, o.line) for o in finding.ops]


VERSIONS = ["2.4", "2.10"]


@pytest.mark.parametrize("version", VERSIONS)
def test_p2p_send_send_cycle_in_a_subgroup_names_global_ranks(tmp_path: Path, version: str) -> None:
    w = world(4, version)
    for r in w:
        r.group("1", [2, 3]).collective("0", "all_reduce", 5)
    w[2].p2p("1", "send", 1, 12, state="scheduled")  # local 0 -> 1: global 2 -> 3
    w[3].p2p("1", "send", 0, 13, state="scheduled")
    report = _report(tmp_path, w)
    assert report.verdict is Verdict.DEADLOCK
    assert _cycle(report) == ((2, 3), [(2, "1", 12), (3, "1", 13)])
    assert all(o.file == SCRIPT for f in report.findings for o in f.ops)


@pytest.mark.parametrize("version", VERSIONS)
def test_p2p_pair_that_matches_is_ok(tmp_path: Path, version: str) -> None:
    w = world(4, version)
    for r in w:
        r.group("1", [2, 3]).collective("0", "all_reduce", 5)
    w[2].p2p("1", "send", 1, 12).p2p("1", "recv", 1, 14)
    w[3].p2p("1", "recv", 0, 13).p2p("1", "send", 0, 15)
    assert _report(tmp_path, w).verdict is Verdict.OK


def _cross(ordered: bool, state: str) -> list[RankDump]:
    w = world(2)
    for r in w:
        r.group("1", [0, 1]).group("2", [0, 1])
    w[0].collective("1", "all_reduce", 10, state=state).collective(
        "2", "all_reduce", 11, state=state
    )
    if ordered:
        w[1].collective("1", "all_reduce", 10, state=state)
        w[1].collective("2", "all_reduce", 11, state=state)
    else:
        w[1].collective("2", "all_reduce", 11, state=state)
        w[1].collective("1", "all_reduce", 10, state=state)
    return w


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_cycle_across_two_groups(tmp_path: Path, form: str) -> None:
    report = _report(tmp_path, _cross(False, "scheduled"), form)
    assert report.verdict is Verdict.DEADLOCK
    ranks, ops = _cycle(report)
    assert ranks == (0, 1)
    lines = [(10, 11), (None, None)][form == "json"]
    assert ops == [(0, "1", lines[0]), (1, "2", lines[1])]
    if form == "json":
        assert any("carry no stack frames" in w for w in report.warnings)


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_same_order_across_groups_is_ok(tmp_path: Path, form: str) -> None:
    assert _report(tmp_path, _cross(True, "completed"), form).verdict is Verdict.OK


def test_coalesced_batch_of_two_sends_deadlocks(tmp_path: Path) -> None:
    w = world(2)
    w[0].batch("0", [("send", 1)], 20, state="scheduled")
    w[1].batch("0", [("send", 0)], 21, state="scheduled")
    report = _report(tmp_path, w)
    assert report.verdict is Verdict.DEADLOCK
    assert _cycle(report) == ((0, 1), [(0, "0", 20), (1, "0", 21)])


def test_coalesced_batch_that_pairs_up_is_ok(tmp_path: Path) -> None:
    w = world(2)
    w[0].batch("0", [("send", 1), ("recv", 1)], 20)
    w[1].batch("0", [("recv", 0), ("send", 0)], 21)
    report = _report(tmp_path, w)
    assert report.verdict is Verdict.OK


def _wrapped(numel1: int) -> list[RankDump]:
    w = world(2)
    for r in w:
        for _ in range(10):
            r.collective("0", "all_reduce", 30)
    w[0].collective("0", "all_reduce", 31, numel=4, state="scheduled")
    w[1].collective(
        "0", "all_reduce", 32, numel=numel1, state="scheduled" if numel1 != 4 else "completed"
    )
    return w


def test_wrapped_ring_buffer_size_mismatch(tmp_path: Path) -> None:
    w = _wrapped(8)
    w[0].write_pickle(tmp_path, keep_last=3)
    w[1].write_pickle(tmp_path, keep_last=5)
    report = analyze(load_flight_session([tmp_path]))
    assert report.verdict is Verdict.DEADLOCK
    [mismatch] = [f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISMATCH]
    assert mismatch.ranks == (0, 1)
    assert sorted((o.rank, o.line) for o in mismatch.ops) == [(0, 31), (1, 32)]
    assert sum("ring buffer wrapped" in w for w in report.warnings) == 2


def test_wrapped_ring_buffer_that_matches_is_ok(tmp_path: Path) -> None:
    w = _wrapped(4)
    w[0].collective("0", "barrier", 33, numel=1, state="completed")  # not wrapped away
    w[0].entries[-2]["state"] = "completed"
    w[0].entries[-2]["time_discovered_completed_ns"] = 1
    w[1].collective("0", "barrier", 33, numel=1)
    w[0].write_pickle(tmp_path, keep_last=4)
    w[1].write_pickle(tmp_path, keep_last=7)
    report = analyze(load_flight_session([tmp_path]))
    assert report.verdict is Verdict.OK
    assert any("ring buffer wrapped" in w for w in report.warnings)


def test_started_collective_a_peer_never_launched_is_a_hang(tmp_path: Path) -> None:
    w = world(2)
    for r in w:
        r.collective("0", "all_reduce", 40)
    w[0].collective("0", "all_reduce", 41, state="started")
    report = _report(tmp_path, w)
    assert report.verdict is Verdict.HANG
    [hang] = report.findings
    assert hang.ranks == (0, 1)
    assert [(o.rank, o.line) for o in hang.ops] == [(0, 41)]


def test_launches_queued_behind_the_first_incomplete_one_are_not_posted(tmp_path: Path) -> None:
    w = _cross(False, "scheduled")
    report = _report(tmp_path, w)
    assert any("queued behind it" in w for w in report.warnings)


def test_missing_rank_is_reported(tmp_path: Path) -> None:
    w = world(3)
    for r in w:
        r.collective("0", "all_reduce", 50)
    w[0].collective("0", "all_reduce", 51, state="scheduled")
    w[1].collective("0", "all_reduce", 51, state="scheduled")
    w[0].write_pickle(tmp_path)
    w[1].write_pickle(tmp_path)
    report = analyze(load_flight_session([tmp_path]))
    assert report.verdict is not Verdict.OK
    assert 2 in {r for f in report.findings for r in f.ranks}
    assert any("rank(s) 2" in w for w in report.warnings)


# -- detection and safe loading ----------------------------------------------------------


def test_a_dl2_run_directory_is_not_taken_for_dumps(tmp_path: Path) -> None:
    (tmp_path / "rank0.trace.jsonl").write_text('{"k":"header"}\n')
    assert not is_flight_input([tmp_path])
    w = world(1)
    w[0].write_pickle(tmp_path / "..", prefix=f"{tmp_path.name}_dump_")
    assert is_flight_input([tmp_path.parent / f"{tmp_path.name}_dump_0"])


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/dl2-flight-pwned",))


def _dl2(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dl2", *args], capture_output=True, text=True, timeout=60
    )


def test_hostile_pickle_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = Path("/tmp/dl2-flight-pwned")
    marker.unlink(missing_ok=True)
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.10", "x": _Evil()}))
    done = _dl2("analyze", str(tmp_path))
    assert done.returncode == 2
    assert not marker.exists()
    assert done.stderr.count("\n") == 1 and "refuses to load posix.system" in done.stderr
    assert "Traceback" not in done.stderr


def test_corrupt_dump_is_one_line_exit_2(tmp_path: Path) -> None:
    w = world(1)
    path = w[0].write_pickle(tmp_path)
    path.write_bytes(path.read_bytes()[:-40])
    done = _dl2("analyze", str(tmp_path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


def _valid_pickle() -> bytes:
    w = world(2)
    w[0].group("1", [0, 1]).collective("1", "all_reduce", 3).p2p("0", "send", 1, 4)
    return pickle.dumps(w[0].as_dict())


_VALID = _valid_pickle()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_fuzz_random_bytes_fail_cleanly(data: bytes) -> None:
    try:
        loads(b"\x80" + data, PICKLE)
    except FlightDumpError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), max_size=8))
def test_fuzz_mutated_dumps_fail_cleanly_or_read(
    tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[int, int]]
) -> None:
    data = bytearray(_VALID)
    for at, byte in edits:
        data[at] = byte
    directory = tmp_path_factory.mktemp("fz")
    (directory / "nccl_trace_rank_0").write_bytes(bytes(data))
    try:
        session = load_flight_session([directory])
    except Dl2Error:  # refused with one line (not a dump, or a corrupt one)
        return
    analyze(session)  # a dump that still reads must analyse without error


def test_gloo_collective_retired_without_a_member_is_read_as_failed(tmp_path: Path) -> None:
    w = world(2, backend="gloo")
    for r in w:
        r.collective("0", "all_reduce", 5)
    w[0].collective("0", "all_reduce", 6)  # retired: gloo failed it, rank 1 had left
    report = _report(tmp_path, w)
    assert report.verdict is Verdict.DEFECT
    kinds = {f.kind: f for f in report.findings}
    orphan = kinds[FindingKind.ORPHANED_WAIT]
    assert orphan.ranks == (0, 1) and [(o.rank, o.line) for o in orphan.ops] == [(0, 6)]
    assert any("read as having exited" in w for w in report.warnings)


def test_gloo_collectives_every_member_launched_are_complete(tmp_path: Path) -> None:
    w = world(2, backend="gloo")
    for r in w:
        r.collective("0", "all_reduce", 5).collective("0", "all_reduce", 6)
    assert _report(tmp_path, w).verdict is Verdict.OK


def test_cli_reads_a_list_of_dump_files_of_any_prefix(tmp_path: Path) -> None:
    w = _cross(False, "scheduled")
    files = [str(w[0].write_json(tmp_path, prefix="a_")), str(w[1].write_pickle(tmp_path))]
    report_path = tmp_path / "report.json"
    done = _dl2("analyze", "--json", str(report_path), *files)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "deadlock"
    [finding] = [f for f in report["findings"] if f["kind"] == "deadlock"]
    assert finding["ranks"] == [0, 1]


def test_a_dump_saved_with_an_extension_keeps_its_rank(tmp_path: Path) -> None:
    # the JSON form saved as `nccl_trace_rank_<r>.json` (as the GPU check does), the
    # pickle as `..._<r>.pkl`: the rank is the number before the extension
    w = _cross(False, "scheduled")
    json_path = w[0].write_json(tmp_path, prefix="nccl_trace_rank_")
    json_path.rename(json_path.with_name(json_path.name + ".json"))
    pickle_path = w[1].write_pickle(tmp_path)
    pickle_path.rename(pickle_path.with_name(pickle_path.name + ".pkl"))
    report_path = tmp_path / "report.json"
    done = _dl2("analyze", "--json", str(report_path), str(tmp_path))
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "deadlock", done.stdout + done.stderr
    [finding] = [f for f in report["findings"] if f["kind"] == "deadlock"]
    assert finding["ranks"] == [0, 1]
