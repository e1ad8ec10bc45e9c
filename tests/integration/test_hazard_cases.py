"""End-to-end: hazards the run did not hit (``dl2 run`` on the hazard cases of
``benchmarks/cases``): collectives of different groups issued in different orders and
receive batches posted before send batches (deadlock on NCCL), an exchange that
completed only because ``--buffer-size`` buffered its sends, isend/irecv works never
waited on; and their correct twins.

Each case states its verdict in its header (``defect``: exit 4; ``ok``: exit 0, no
finding), the ranks its finding names and its culprit lines; a header field
``buffer=SIZE`` runs it under ``dl2 run --buffer-size SIZE``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from test_online import dl2_run

CASES_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "cases"
#: the hazard cases (each defect with its correct twin)
HAZARD_CASES = [
    "order_inversion__3ranks_subgroups",
    "order_inversion__ok_fixed_order",
    "batch_order__ring_recv_batch_first",
    "batch_order__ok_mixed_grouping",
    "buffered_exchange__just_under",
    "buffered_exchange__ok_even_odd",
    "unwaited_work__isend_dropped_in_loop",
    "unwaited_work__ok_waited_later",
    "unwaited_work__irecv_outstanding_at_exit",
    "unwaited_work__ok_irecv_waited",
]
EXIT_CODES = {"ok": 0, "deadlock": 3, "defect": 4}
RUN_TIMEOUT_S = 90
FIELD = re.compile(r"^#\s*dl2-(?:case|expect):(.*)$")
CULPRIT = re.compile(r"#\s*dl2:\s*culprit\b")


def _header(path: Path) -> tuple[dict[str, str], set[int]]:
    fields: dict[str, str] = {}
    culprits = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = FIELD.match(line)
        if match:
            fields.update(item.split("=", 1) for item in match.group(1).split())
        if CULPRIT.search(line):
            culprits.add(number)
    return fields, culprits


def _run(case: str, dl2_bin: Path, tmp_path: Path, *options: str) -> tuple[int, dict, str]:
    """``dl2 run`` of a case (with its header's buffer), as :func:`test_online.dl2_run`."""
    path = CASES_DIR / f"{case}.py"
    fields, _ = _header(path)
    buffer = ["--buffer-size", fields["buffer"]] if "buffer" in fields else []
    args = ["--hang-timeout", "30", *buffer, *options, "-n", fields["world"], str(path)]
    run = dl2_run(dl2_bin, tmp_path / "run", args, timeout=RUN_TIMEOUT_S)
    assert run.returncode != -999, f"dl2 run {case} ran past {RUN_TIMEOUT_S} s:\n{run.output}"
    return run.returncode, run.report, run.output


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", HAZARD_CASES)
def test_hazard_case(case: str, dl2_bin: Path, tmp_path: Path) -> None:
    fields, culprits = _header(CASES_DIR / f"{case}.py")
    code, report, out = _run(case, dl2_bin, tmp_path)
    label = fields["label"]
    assert (code, report["verdict"]) == (EXIT_CODES[label], label), out
    if label == "ok":
        assert report["findings"] == [], out
        return
    kinds = {f["kind"] for f in report["findings"]}
    expected = {"unwaited-work" if case.startswith("unwaited_work") else "potential-deadlock"}
    if label == "deadlock":  # a dropped work hangs the job as it does without dl2
        expected.add("deadlock")
    assert kinds == expected, out
    named = {r for f in report["findings"] for r in f["ranks"]}
    assert named >= {int(r) for r in fields["ranks"].split(",")}, out
    lines = {
        op["line"]
        for f in report["findings"]
        for op in f["ops"]
        if os.path.basename(op["file"] or "") == f"{case}.py"
    }
    assert culprits <= lines, out
    message = report["findings"][-1]["message"]
    if case.startswith("unwaited_work"):
        assert "was never waited on" in message
    elif case.startswith("buffered_exchange"):
        assert "when sends of 65,532 bytes or more are not buffered" in message
    elif case.startswith("order_inversion"):
        assert message.startswith("Deadlocks on NCCL")
    else:
        assert "under nccl" in message


@pytest.mark.timeout(150)
def test_no_hazards_reports_only_what_happened(dl2_bin: Path, tmp_path: Path) -> None:
    code, report, out = _run("order_inversion__3ranks_subgroups", dl2_bin, tmp_path, "--no-hazards")
    assert (code, report["verdict"], report["findings"]) == (0, "ok", []), out
