"""The HTML report: its structure, parsed back, and the escaping of every trace string."""

from __future__ import annotations

from pathlib import Path

import pytest
from lxml import html as lxml_html

import sample_reports
from builders import finding
from builders import op_ref
from builders import rank_state
from builders import report
from dl2.analysis import analyze
from dl2.cli import main
from dl2.cli.output import write_html_quietly
from dl2.model.execution_graph import build_execution_graph
from dl2.render import html as html_render
from dl2.render.console import headline
from dl2.render.html import render_html
from dl2.report import FindingKind
from dl2.report import Report
from dl2.trace.session import FAILED
from trace_builders import ranks
from trace_builders import session
from trace_builders import write_run_dir

EVIL = "<script>alert(1)</script>"
#: a file name with markup but no "/" (the report shows a file's base name)
EVIL_FILE = "<img src=x onerror=alert(1)>.py"


def parse(text: str) -> lxml_html.HtmlElement:
    return lxml_html.document_fromstring(text)


def nodes(doc: lxml_html.HtmlElement) -> list[lxml_html.HtmlElement]:
    return doc.xpath("//svg//g[contains(concat(' ', @class, ' '), ' node ')]")


def edges(doc: lxml_html.HtmlElement, css: str = "edge") -> list[lxml_html.HtmlElement]:
    """The graph's edges, those with class ``css`` (e.g. "cycle") only if given."""
    return doc.xpath(
        "//svg//g[contains(concat(' ', @class, ' '), ' edge ')"
        f" and contains(concat(' ', @class, ' '), ' {css} ')]"
    )


def node_ranks(doc: lxml_html.HtmlElement) -> list[int]:
    return [int(n.get("data-ranks")) for n in nodes(doc)]


def send_send(file: str = "train.py") -> tuple[Report, object]:
    """A 2-rank send/send deadlock built from traces, with its execution graph."""
    r0, r1 = ranks(2, file=file)
    r0.call("all_reduce", 5)
    r1.call("all_reduce", 5)
    r0.call("send", 10, peer=1, complete=False)
    r1.call("send", 20, peer=0, complete=False)
    s = session([r0, r1])
    graph = build_execution_graph(s)
    return analyze(s, graph=graph), graph


def test_deadlock_page_has_headline_nodes_cycle_findings_and_warnings() -> None:
    # GIVEN the send/send deadlock of the samples, with two warnings
    base = sample_reports.sendsend_deadlock()
    rep = Report(
        base.verdict,
        base.findings,
        base.ranks,
        base.world_size,
        warnings=("rank 1: truncated record", "rank 0: 3 corrupt records skipped"),
        job=base.job,
    )
    # WHEN it is drawn and parsed back
    doc = parse(render_html(rep))
    # THEN the headline is the console's, and the verdict is tagged
    assert doc.get_element_by_id("headline").text_content() == headline(rep)
    assert doc.get_element_by_id("verdict").text_content() == "deadlock"
    # one node per rank, both in the cycle, and the two waits drawn as cycle edges
    assert node_ranks(doc) == [1, 1]
    assert all("cycle" in n.get("class").split() for n in nodes(doc))
    cycle = edges(doc, "cycle")
    assert len(cycle) == 2
    labels = [" ".join(e.xpath(".//text//text()")) for e in cycle]
    assert any("send→1 #0 · group 0" in t and "train.py:42" in t for t in labels), labels
    assert any("send→0 #0 · group 0" in t and "train.py:57" in t for t in labels), labels
    # each node links to the row that unfolds it
    for node in nodes(doc):
        target = node.getparent().get("href")[1:]
        assert doc.get_element_by_id(target).tag == "details"
    # findings and warnings listed
    findings = doc.find_class("finding")
    assert len(findings) == len(rep.findings) == 1
    assert sample_reports.SEND_HINT in findings[0].text_content()
    warnings = [li.text_content() for li in doc.xpath("//ul[@class='warnings']/li")]
    assert warnings == list(rep.warnings)


def test_every_sample_renders_one_node_per_rank_or_folded_run() -> None:
    for name, make in sample_reports.SAMPLES.items():
        rep = make()
        doc = parse(render_html(rep))
        # every rank is in exactly one node
        assert sum(node_ranks(doc)) == len(rep.ranks), name
        assert len(doc.find_class("finding")) == min(len(rep.findings), 50), name


def test_built_trace_shows_timeline_with_stuck_ops_and_divergence() -> None:
    # GIVEN a deadlock built from traces, with the execution graph
    rep, graph = send_send()
    # WHEN drawn with the graph
    doc = parse(render_html(rep, graph))  # type: ignore[arg-type]
    # THEN each rank has a timeline row whose last op is marked stuck
    rows = doc.xpath("//div[@class='tl']/div[contains(@class, 'ops')]")
    assert len(rows) == 2
    for row in rows:
        chips = row.xpath("./span[contains(@class, 'chip')]")
        assert chips[0].text_content() == "all_reduce #0"
        assert "stuck" in chips[-1].get("class").split()
        assert all("stuck" not in c.get("class").split() for c in chips[:-1])
    # and the cycle's stuck ops side by side
    side = doc.get_element_by_id("divergence")
    columns = side.find_class("col")
    assert [c.find_class("op")[0].text_content() for c in columns] == ["send→1", "send→0"]


def test_first_divergent_collective_side_by_side() -> None:
    # GIVEN rank 1 reducing float16 where rank 0 reduces float32, at the second collective
    r0, r1 = ranks(2)
    r0.call("all_reduce", 5)
    r1.call("all_reduce", 5)
    r0.call("all_reduce", 7, dtype="float32")
    r1.call("all_reduce", 8, dtype="float16")
    s = session([r0.end(), r1.end()])
    graph = build_execution_graph(s)
    rep = analyze(s, graph=graph)
    # WHEN drawn
    doc = parse(render_html(rep, graph))
    # THEN the divergence names collective #1 and shows both ranks' ops side by side
    side = doc.get_element_by_id("divergence")
    assert "collective #1 of group 0" in side.text_content()
    assert "dtype" in side.text_content()
    subs = [c.text_content() for c in side.find_class("col")]
    assert len(subs) == 2 and "float32" in subs[0] and "float16" in subs[1], subs
    # and the timeline marks those two ops
    marked = doc.xpath("//span[contains(@class, 'diverge') and contains(@class, 'chip')]")
    assert len([m for m in marked if m.getparent().get("class") == "ops"]) == 2


def test_trace_strings_with_markup_stay_text() -> None:
    # GIVEN traces whose file, function and group names are markup
    r0, r1 = ranks(2, file=EVIL_FILE)
    for r in (r0, r1):
        r.create_group(EVIL, [0, 1])
    r0.call("all_reduce", 3, gid=EVIL, function=EVIL)
    r1.call("all_reduce", 3, gid=EVIL, function=EVIL)
    r0.call("send", 10, peer=1, complete=False, function=EVIL)
    r1.call("send", 20, peer=0, complete=False, function=EVIL)
    s = session([r0, r1])
    graph = build_execution_graph(s)
    rep = analyze(s, graph=graph)
    job = {"command": ["python", EVIL, "--name=<b>x</b>"]}
    rep = Report(rep.verdict, rep.findings, rep.ranks, rep.world_size, (EVIL,), job, rep.gaps)
    # WHEN drawn
    text = render_html(rep, graph)
    doc = parse(text)
    # THEN the page's only script is its own, and the markup is there as text
    scripts = doc.xpath("//script")
    assert len(scripts) == 1 and "alert" not in scripts[0].text_content()
    assert [b.text_content() for b in doc.xpath("//b")] == ["Fix:"]  # the page's own
    assert not doc.xpath("//img")
    assert EVIL not in text and EVIL_FILE not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    body = doc.text_content()
    assert f"{EVIL_FILE}:10" in body  # the file name, in the findings and the graph
    assert f"in {EVIL}" in body  # the function name
    assert f"python {EVIL} --name=<b>x</b>" in body  # argv
    assert doc.xpath("//ul[@class='warnings']/li")[0].text_content() == EVIL
    chip_titles = [c.get("title") for c in doc.xpath("//span[contains(@class, 'chip')]")]
    assert any(f"group {EVIL} #0" in (t or "") for t in chip_titles), chip_titles


def test_large_world_folds_ranks_in_the_same_state() -> None:
    # GIVEN 1,024 ranks: 0 and 1 in a send/send cycle, 2-1023 in barrier #41 waiting on them
    send0 = op_ref(0, "send", peer=1, seq=0, line=42)
    send1 = op_ref(1, "send", peer=0, seq=0, line=57)
    barrier = op_ref(2, "barrier", seq=41, line=80)
    states = [rank_state(0, op=send0, waits_on=[1]), rank_state(1, op=send1, waits_on=[0])]
    states += [
        rank_state(r, op=op_ref(r, "barrier", seq=41, line=80), waits_on=[0, 1])
        for r in range(2, 1024)
    ]
    rep = report(
        finding(FindingKind.DEADLOCK, send0, send1, barrier, ranks=range(1024), cycle=(0, 1)),
        ranks=states,
    )
    # WHEN drawn
    text = render_html(rep)
    doc = parse(text)
    # THEN three nodes: the cycle's two ranks and one for the 1,022 others
    assert node_ranks(doc) == [1, 1, 1022]
    folded = nodes(doc)[2]
    summary = folded.xpath("./title")[0].text_content()
    assert summary == "ranks 2-1023: blocked in barrier(group 0 #41) at train.py:80"
    # which unfolds to a list of its ranks, capped
    details = doc.get_element_by_id(folded.getparent().get("href")[1:])
    assert len(details.xpath(".//tr")) == 1 + html_render.MAX_MEMBERS + 1
    # its waits are edges to both cycle nodes, the cycle's own in red
    assert len(edges(doc, "cycle")) == 2
    assert len(edges(doc)) == 4
    # the timeline folds them too, and the page stays small
    assert "ranks 2-1023" in doc.get_element_by_id("timeline").text_content()
    assert len(text.encode()) < 2 * 1024 * 1024


def test_rendering_is_deterministic() -> None:
    rep, graph = send_send()
    assert render_html(rep, graph) == render_html(rep, graph)  # type: ignore[arg-type]


def test_analyze_html_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a recorded deadlock
    r0, r1 = ranks(2)
    r0.call("send", 10, peer=1, complete=False)
    r1.call("send", 20, peer=0, complete=False)
    run = write_run_dir([r0, r1], tmp_path / "run")
    # WHEN analysed with --html
    out = tmp_path / "page.html"
    code = main(["analyze", str(run), "--html", str(out)])
    # THEN the deadlock's exit status, and the page holds the cycle
    assert code == 3
    doc = parse(out.read_text())
    assert len(edges(doc, "cycle")) == 2


def test_analyze_html_without_the_extra_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a run directory, and the html extra missing
    r0, r1 = ranks(2)
    run = write_run_dir([r0.end(), r1.end()], tmp_path / "run")
    monkeypatch.setattr(html_render.importlib_util, "find_spec", lambda name: None)
    # WHEN analysed with --html
    code = main(["analyze", str(run), "--html", str(tmp_path / "page.html")])
    # THEN exit 2, one line on stderr naming the extra, no page
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "dl2[html]" in err, err
    assert not (tmp_path / "page.html").exists()


def test_a_failing_page_is_one_warning_and_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a renderer that breaks
    def broken(*args: object) -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(html_render, "render_html", broken)
    # WHEN dl2 run's conclusion writes the page
    path = tmp_path / "report.html"
    written = write_html_quietly(sample_reports.sendsend_deadlock(), path, None)
    # THEN nothing is written and one line says why
    assert written is False and not path.exists()
    err = capsys.readouterr().err
    assert err == "dl2: report.html not written: boom\n"


def test_a_rank_that_failed_inside_a_call_is_not_marked_stuck() -> None:
    # GIVEN rank 0 dead inside its send, rank 1 blocked in its receive from rank 2
    r0, r1, r2 = ranks(3)
    r0.call("send", 10, peer=2, complete=False)
    r1.call("recv", 20, peer=2, complete=False)
    s = session([r0, r1, r2.end()], states={0: FAILED})
    graph = build_execution_graph(s)
    rep = analyze(s, graph=graph)
    assert {st.rank: st.status.value for st in rep.ranks}[0] == "failed"
    # WHEN drawn
    doc = parse(render_html(rep, graph))
    # THEN only rank 1's op is stuck
    rows = doc.xpath("//div[@class='tl']/div[contains(@class, 'ops')]")
    last = [
        row.xpath("./span")[-1].get("class").split() if row.xpath("./span") else [] for row in rows
    ]
    assert "stuck" not in last[0] and "stuck" in last[1], last
