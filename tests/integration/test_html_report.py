"""`dl2 run` draws the HTML report beside report.json."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_online import dl2_run

SENDSEND = Path(__file__).resolve().parents[2] / "examples" / "sendsend.py"


class _Graph(HTMLParser):
    """Counts the wait-for graph's nodes and cycle edges, and the findings."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes = 0
        self.cycle_edges = 0
        self.findings = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "g" and "node" in classes:
            self.nodes += 1
        if tag == "g" and "edge" in classes and "cycle" in classes:
            self.cycle_edges += 1
        if tag == "div" and "finding" in classes:
            self.findings += 1


@pytest.mark.timeout(180)
def test_dl2_run_of_a_deadlock_writes_report_html(dl2_bin: Path, tmp_path: Path) -> None:
    # GIVEN the 2-rank send/send deadlock of the examples
    # WHEN dl2 run watches it
    run = dl2_run(dl2_bin, tmp_path / "run", ["-n", "2", str(SENDSEND)])
    # THEN it is diagnosed, and report.html sits beside report.json, drawing the cycle
    assert run.returncode == 3, run.output
    report = json.loads((run.run_dir / "report.json").read_text())
    page = run.run_dir / "report.html"
    assert page.exists(), run.output
    assert "not written" not in run.output
    assert f"report drawn in {page}" in run.output  # the user is told where it is
    parsed = _Graph()
    parsed.feed(page.read_text())
    assert parsed.nodes == 2
    assert parsed.cycle_edges == 2
    assert parsed.findings == len(report["findings"]) >= 1
    assert "sendsend.py:17" in page.read_text()
