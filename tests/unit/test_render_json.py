"""The JSON report: its shape, its stability, and report_to_dict."""

from __future__ import annotations

import json
from enum import Enum

import pytest

from builders import finding
from builders import op_ref
from builders import rank_state
from builders import report
from dl2.render.jsonreport import FORMAT_VERSION
from dl2.render.jsonreport import JsonRenderer
from dl2.render.jsonreport import report_to_dict
from dl2.report import FindingKind
from dl2.report import Verdict
from sample_reports import SAMPLES
from sample_reports import sendsend_deadlock
from sample_reports import wildcard_wait

OP_KEYS = {"rank", "op", "api", "group", "seq", "peer", "detail", "file", "line", "function"}


def test_top_level_shape() -> None:
    data = report_to_dict(sendsend_deadlock())
    assert set(data) == {
        "format",
        "format_version",
        "verdict",
        "exit_code",
        "world_size",
        "findings",
        "ranks",
        "warnings",
        "job",
    }
    assert data["format"] == "dl2-report"
    assert data["format_version"] == FORMAT_VERSION == 3
    assert (data["verdict"], data["exit_code"], data["world_size"]) == ("deadlock", 3, 2)


@pytest.mark.parametrize("verdict", list(Verdict))
def test_every_verdict(verdict: Verdict) -> None:
    data = report_to_dict(report(verdict=verdict))
    assert data["verdict"] == verdict.value
    assert data["exit_code"] == verdict.exit_code


def test_deadlock_finding_and_ops() -> None:
    (deadlock,) = report_to_dict(sendsend_deadlock())["findings"]
    assert deadlock["kind"] == "deadlock"
    assert deadlock["ranks"] == [0, 1]
    assert deadlock["cycle"] == [0, 1]
    assert deadlock["group"] is None
    assert deadlock["hint"].startswith("Let one rank receive first")
    assert [set(op) for op in deadlock["ops"]] == [OP_KEYS, OP_KEYS]
    assert deadlock["ops"][1] == {
        "rank": 1,
        "op": "send",
        "api": None,
        "group": "0",
        "seq": 0,
        "peer": 0,
        "detail": "float32[1024] tag 0",
        "file": "train.py",
        "line": 57,
        "function": None,
    }


def test_rank_states_including_or_wait_and_no_op() -> None:
    rep = wildcard_wait()
    ranks = report_to_dict(rep)["ranks"]
    assert ranks[0]["waits_on"] == [1, 2]
    assert ranks[0]["any_of"] is True
    assert ranks[0]["op"]["peer"] is None
    assert report_to_dict(report(ranks=[rank_state(0, "exited")]))["ranks"] == [
        {"rank": 0, "status": "exited", "op": None, "waits_on": [], "any_of": False}
    ]


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_render_is_sorted_indented_json_of_report_to_dict(sample: str) -> None:
    rep = SAMPLES[sample]()
    text = JsonRenderer().render(rep)
    assert json.loads(text) == report_to_dict(rep)
    assert (
        text == json.dumps(report_to_dict(rep), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    )


def test_job_facts_become_plain_json() -> None:
    # GIVEN launcher facts with tuples, sets, enums and objects JSON cannot hold
    class Color(Enum):
        RED = "red"

    job = {"command": ("python", "train.py"), "ranks": {3, 1, 2}, "c": Color.RED, "x": object}
    data = report_to_dict(report(job=job))["job"]
    # THEN they come out as lists, sorted lists, values and strings
    assert data["command"] == ["python", "train.py"]
    assert data["ranks"] == [1, 2, 3]
    assert data["c"] == "red"
    assert data["x"] == "<class 'object'>"
    assert data == json.loads(JsonRenderer().render(report(job=job)))["job"]


def test_non_ascii_is_kept_readable() -> None:
    rep = report(finding(FindingKind.P2P_UNMATCHED, op_ref(op="send", peer=1), message="send→1"))
    assert "send→1" in JsonRenderer().render(rep)


def test_no_time_fields() -> None:
    text = JsonRenderer().render(SAMPLES["large"]())
    for key in ('"t"', '"time"', '"wall"', '"timestamp"', '"date"', '"t0"'):
        assert key not in text
