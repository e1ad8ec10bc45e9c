"""End-to-end tests: ``dl2 run`` on each core case (``core_cases.txt``, scripts in
``benchmarks/cases``).

Each case is a plain torch.distributed (gloo) script whose header states the ground
truth established without dl2 (see ``core_cases.md`` and ``benchmarks/groundtruth.py``)::

    # dl2-case: label=deadlock world=2 category=send-send-cycle
    # dl2-expect: ranks=0,1

and whose culprit lines (the user calls that hang or mismatch) end in
``# dl2: culprit``. The test runs ``dl2 run`` on the script and checks the exit
status, the JSON report's verdict, the ranks of the findings and that every culprit
line is named by an operation of some finding.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dl2.render.jsonreport import FORMAT_VERSION as REPORT_FORMAT_VERSION
from dl2.trace.session import load_session
from model_agreement import check_agreement
from teardown import torn_down

#: the core cases: one per deadlock/defect category of the core issue and a correct twin
#: each; the scripts live with the rest of the evaluation suite in benchmarks/cases
CASES_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "cases"
CORE_CASES = Path(__file__).resolve().parent / "core_cases.txt"

#: exit status of ``dl2 run`` and report verdict for each case label
EXIT_CODES = {"ok": 0, "deadlock": 3, "defect": 4}

#: ``dl2 run`` options: a rank blocked this long without a cycle is reported as hung
HANG_TIMEOUT_S = 30
#: hard limit of one ``dl2 run``; the process group is killed past it
RUN_TIMEOUT_S = 90

HEADER = re.compile(r"^#\s*dl2-(case|expect):(.*)$")
CULPRIT = re.compile(r"#\s*dl2:\s*culprit\b")


@dataclass(frozen=True)
class Case:
    """One case script and the ground truth its header states.

    Attributes:
        path: the script.
        label: "deadlock", "defect" or "ok".
        world: number of ranks to launch.
        category: the kind of bug (or of correct pattern) the case exercises.
        ranks: ranks the findings must name (empty for ok cases).
        culprits: 1-based numbers of the lines marked ``# dl2: culprit``.
    """

    path: Path
    label: str
    world: int
    category: str
    ranks: frozenset[int]
    culprits: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.path.stem


def parse_case(path: Path) -> Case:
    """Read a case's ``dl2-case`` / ``dl2-expect`` header and its culprit lines."""
    fields: dict[str, str] = {}
    culprits = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        header = HEADER.match(line)
        if header:
            for item in header.group(2).split():
                key, sep, value = item.partition("=")
                if not sep:
                    raise ValueError(f"{path.name}:{number}: expected key=value, got {item!r}")
                fields[key] = value
        if CULPRIT.search(line):
            culprits.append(number)
    missing = {"label", "world", "category"} - fields.keys()
    if missing:
        raise ValueError(f"{path.name}: header lacks {sorted(missing)}")
    ranks = fields.get("ranks", "")
    return Case(
        path=path,
        label=fields["label"],
        world=int(fields["world"]),
        category=fields["category"],
        ranks=frozenset(int(rank) for rank in ranks.split(",") if rank),
        culprits=tuple(culprits),
    )


def case_files() -> list[Path]:
    names = CORE_CASES.read_text().split()
    return sorted(CASES_DIR / f"{name}.py" for name in names)


CASES = [parse_case(path) for path in case_files()]


def _case_param(case: Case) -> Any:
    return pytest.param(case, id=case.name)


# --- the cases themselves (no dl2 needed) ---------------------------------------------


@pytest.mark.parametrize("case", [_case_param(c) for c in CASES])
def test_case_header(case: Case) -> None:
    """A case's header is complete and consistent with its file name and body."""
    assert case.label in EXIT_CODES
    assert 2 <= case.world <= 4
    assert re.fullmatch(r"[a-z0-9_]+__[a-z0-9_]+", case.name), "name: <category>__<variant>"
    if case.label == "ok":
        assert case.name.split("__")[1].startswith("ok"), "correct twins are named __ok_*"
        assert not case.ranks
        assert not case.culprits
    else:
        assert case.ranks, "a non-ok case states its ranks"
        assert max(case.ranks) < case.world
        assert case.culprits, "a non-ok case marks its culprit lines"


def test_every_category_has_a_bug_and_a_correct_twin() -> None:
    labels: dict[str, set[str]] = {}
    prefixes: dict[str, set[str]] = {}
    for case in CASES:
        labels.setdefault(case.category, set()).add(case.label)
        prefixes.setdefault(case.name.split("__")[0], set()).add(case.category)
    for prefix, categories in sorted(prefixes.items()):
        assert len(categories) == 1, f"{prefix}__*: several categories {sorted(categories)}"
    for category, seen in sorted(labels.items()):
        assert "ok" in seen, f"{category}: no correct twin"
        assert seen - {"ok"}, f"{category}: no deadlock or defect case"


# --- dl2 run on each case ---------------------------------------------------------------


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return "<no output>"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _finding_ops(report: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for finding in report.get("findings", []):
        yield from finding.get("ops", [])


def _summary(report: dict[str, Any]) -> str:
    lines = [f"verdict={report.get('verdict')} exit_code={report.get('exit_code')}"]
    for finding in report.get("findings", []):
        kind, ranks = finding.get("kind"), finding.get("ranks")
        lines.append(f"  {kind} ranks={ranks}: {finding.get('message')}")
        for op in finding.get("ops", []):
            where = f"{os.path.basename(op.get('file') or '?')}:{op.get('line')}"
            lines.append(f"    rank {op.get('rank')} {op.get('op')} at {where}")
    lines.extend(f"  warning: {w}" for w in report.get("warnings", []))
    return "\n".join(lines)


def _dl2_run(case: Case, dl2_bin: Path, where: Path) -> tuple[int, Path, Path]:
    """``dl2 run`` of the case in ``where``: its exit status, JSON report path and log
    (killed, with what it started, past RUN_TIMEOUT_S)."""
    where.mkdir(parents=True, exist_ok=True)
    report_path = where / "report.json"
    log_path = where / "dl2.log"
    cmd = [
        str(dl2_bin),
        "run",
        "--hang-timeout",
        str(HANG_TIMEOUT_S),
        "--json",
        str(report_path),
        "-n",
        str(case.world),
        str(case.path),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # Output goes to a file, not a pipe: a leftover rank holding a pipe open would
    # block the read after dl2 itself is gone.
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=where,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            pytest.fail(
                f"dl2 run did not finish within {RUN_TIMEOUT_S}s (killed)\n{_tail(log_path)}"
            )
        finally:
            # Whatever dl2 left behind in its process group (stray ranks) goes too.
            _kill_group(proc.pid)
    return returncode, report_path, log_path


def _warnings(report_path: Path) -> list[str]:
    try:
        return list(json.loads(report_path.read_text()).get("warnings", []))
    except (OSError, ValueError):
        return []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", [_case_param(c) for c in CASES])
def test_dl2_run(case: Case, dl2_bin: Path, tmp_path: Path) -> None:
    returncode, report_path, log_path = _dl2_run(case, dl2_bin, tmp_path / "run")
    log = log_path.read_text(errors="replace")
    if case.label == "ok" and torn_down(returncode, log, _warnings(report_path)):
        # torch aborted a rank at interpreter teardown, after its work: once more
        returncode, report_path, log_path = _dl2_run(case, dl2_bin, tmp_path / "again")
    output = _tail(log_path)

    assert report_path.exists(), f"no JSON report; dl2 exited {returncode}\n{output}"
    report = json.loads(report_path.read_text())
    context = f"{_summary(report)}\n--- dl2 output ---\n{output}"

    # the incremental model agrees with matching from scratch on the recorded traces
    run_dirs = {p.parent for p in report_path.parent.rglob("*.dl2.jsonl")}
    for run_dir in run_dirs:
        session = load_session(run_dir)
        check_agreement(session)
        if case.category != "store-wait":
            # torch's own store traffic (rendezvous, new_group, barrier) is not recorded
            stores = [r for t in session.traces.values() for r in t.records if r.kind == "store"]
            assert not stores, f"store calls recorded in {case.name}: {stores[:3]}"

    assert report.get("format") == "dl2-report", context
    assert report.get("format_version") == REPORT_FORMAT_VERSION, context
    expected_code = EXIT_CODES[case.label]
    assert returncode == expected_code, f"exit {returncode}, expected {expected_code}\n{context}"
    assert report["verdict"] == case.label, context
    assert report.get("exit_code") == returncode, context

    findings = report["findings"]
    if case.label == "ok":
        assert findings == [], context
        return

    assert findings, context
    named = {rank for finding in findings for rank in finding["ranks"]}
    assert named >= case.ranks, f"findings name ranks {sorted(named)}\n{context}"
    if case.label == "deadlock":
        first = set(findings[0]["ranks"])
        assert first == case.ranks, f"first finding names {sorted(first)}\n{context}"

    located = {
        (os.path.basename(op["file"]), op.get("line"))
        for op in _finding_ops(report)
        if op.get("file")
    }
    missing = [n for n in case.culprits if (case.path.name, n) not in located]
    assert not missing, f"culprit lines {missing} of {case.path.name} not in findings\n{context}"
