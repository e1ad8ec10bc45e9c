"""dl2 on Flight Recorder dumps taken from a CUDA build (real NCCL, tests/fr_cuda)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dl2.analysis import analyze
from dl2.flight.loader import load_flight_session
from dl2.model.execution_graph import build_execution_graph
from dl2.report import Verdict
from dl2.trace.schema.decode import report_frame

DUMPS = Path(__file__).resolve().parents[1] / "fr_cuda"

#: the probe's ops as dl2 reads them: (op, group, position on the group, line)
PROBE = [
    ("create_group", "1", None, None),
    ("all_reduce", "0", 0, 15),
    ("broadcast", "0", 1, 16),
    ("all_reduce", "1", 0, 18),
    ("all_gather", "0", 2, 20),
    ("all_reduce", "0", 3, 21),
    ("send", "0", None, 24),  # batch_isend_irecv: one batch of two P2P ops
    ("recv", "0", None, 24),
    ("all_reduce_coalesced", "0", 4, 25),  # the `with _coalescing_manager()` line
    ("reduce_scatter_tensor", "0", 5, 28),
]


def _ops(folder: str) -> list:
    session = load_flight_session([str(DUMPS / folder)])
    return list(build_execution_graph(session).timelines[0].ops)


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_a_real_nccl_dump_reads_op_for_op(form: str) -> None:
    ops = _ops(f"probe-{form}")
    assert [(o.op, o.gid, o.seq) for o in ops] == [(op, g, s) for op, g, s, _ in PROBE]
    # the P2P batch stays a batch of its own: not joined to the all_reduce before it,
    # whose collective sequence id its closing entry repeats
    send, recv = ops[6], ops[7]
    assert send.batch is not None and send.batch == recv.batch
    assert send.peer == 0 and recv.peer == 0
    assert all(o.completed for o in ops)
    frames = [report_frame(o.stack) if o.stack else None for o in ops]
    if form == "json":  # the JSON form carries no frames
        assert frames == [None] * len(ops)
    else:
        assert [f.line if f else None for f in frames] == [line for *_, line in PROBE]
        assert {Path(f.file).name for f in frames if f} == {"fr_probe.py"}


@pytest.mark.parametrize("folder", ["probe-pickle", "probe-json", "check-pickle", "check-json"])
def test_a_real_healthy_nccl_job_reads_ok(folder: str) -> None:
    report = analyze(load_flight_session([str(DUMPS / folder)]))
    assert report.verdict is Verdict.OK, report
    assert report.world_size == 1
    assert any("schema 2.10, backend nccl" in w for w in report.warnings)
    if folder.endswith("json"):
        assert any("carry no stack frames" in w for w in report.warnings)
