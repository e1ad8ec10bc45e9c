"""The JSON report: a stable, versioned document for automation and golden files.

Shape (keys sorted, no times, so two runs of one job give equal files)::

    {"format": "dl2-report", "format_version": 2,
     "verdict": "ok" | "deadlock" | "hang" | "defect" | "interrupted" | "incomplete" |
                "job-failed",
     "exit_code": 0 | 3 | 3 | 4 | 130 | 5 | 1 (in that order),
     "world_size": N,
     "findings": [{"kind", "ranks", "message", "hint", "group", "cycle", "ops": [OP...]}],
     "ranks": [{"rank", "status", "op": OP | null, "waits_on", "any_of"}],
     "warnings": [str...], "job": {...launcher facts...}}

    OP = {"rank", "op", "api", "group", "seq", "peer", "detail", "file", "line", "function",
          "wait_file", "wait_line" (only where the rank waited on it at another line),
          "called_from" (only where the program reached file:line from another file),
          "inside" (only where file:line called into an installed package that
          communicates): FRAME}
    FRAME = {"file", "line", "function"}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from collections.abc import Sequence
from enum import Enum
from typing import Any
from typing import ClassVar

import msgspec

from dl2.render.base import Renderer
from dl2.report import Finding
from dl2.report import OpRef
from dl2.report import RankState
from dl2.report import Report

FORMAT = "dl2-report"

# History of FORMAT_VERSION (bump on any change a reader could notice):
#   1: first version.
#   2: an op waited on at another line than the one that issued it (``work.wait()``)
#      carries ``wait_file`` and ``wait_line``.
#   3: an op reached from another file carries ``called_from``, one issued inside an
#      installed package ``inside`` (the lines around ``file:line``).
FORMAT_VERSION = 3


class JsonRenderer(Renderer):
    """Renders the report as indented JSON with sorted keys (see the module docstring)."""

    name: ClassVar[str] = "json"
    output_file_extension: ClassVar[str] = "json"

    def render(self, report: Report) -> str:
        # ensure_ascii=False keeps messages ("send→1") readable; files are written as UTF-8.
        # json.dumps with an indent runs the pure-Python encoder (0.5 s for a report of
        # 8,192 ranks): encode compactly in C, then indent the text (byte for byte the
        # same as json.dumps(indent=2))
        compact = json.dumps(report_to_dict(report), sort_keys=True, ensure_ascii=False)
        text = msgspec.json.format(compact.encode(), indent=2).decode()
        return text + "\n"


def report_to_dict(report: Report) -> dict[str, Any]:
    """The JSON report as plain data: dicts, lists, str, int, bool and None only.

    ``json.loads(JsonRenderer().render(report)) == report_to_dict(report)``.
    """
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "verdict": report.verdict.value,
        "exit_code": report.exit_code,
        "world_size": report.world_size,
        "findings": [_finding(f) for f in report.findings],
        "ranks": _rank_states(report.ranks),
        "warnings": list(report.warnings),
        "job": _plain(report.job),
    }


def _finding(finding: Finding) -> dict[str, Any]:
    return {
        "kind": finding.kind.value,
        "ranks": list(finding.ranks),
        "message": finding.message,
        "hint": finding.hint,
        "group": finding.group,
        "cycle": list(finding.cycle),
        "ops": [_op(op) for op in finding.ops],
    }


def _rank_states(states: Sequence[RankState]) -> list[dict[str, Any]]:
    # the ranks blocked in one collective share their waits_on tuple: one list for all of
    # them (W/2 ranks waiting on W/2 others would otherwise copy W^2/4 ranks)
    lists: dict[int, tuple[tuple[int, ...], list[int]]] = {}
    out = []
    for state in states:
        waits = state.waits_on
        known = lists.get(id(waits))
        if known is None or known[0] is not waits:
            known = lists[id(waits)] = (waits, list(waits))
        out.append(
            {
                "rank": state.rank,
                "status": str(state.status),
                "op": None if state.op is None else _op(state.op),
                "waits_on": known[1],
                "any_of": state.any_of,
            }
        )
    return out


def _op(op: OpRef) -> dict[str, Any]:
    fields = {
        "rank": op.rank,
        "op": op.op,
        "api": op.api,
        "group": op.group,
        "seq": op.seq,
        "peer": op.peer,
        "detail": op.detail,
        "file": op.file,
        "line": op.line,
        "function": op.function,
    }
    if op.wait_line is not None:
        fields["wait_file"] = op.wait_file
        fields["wait_line"] = op.wait_line
    for name, frame in (("called_from", op.called_from), ("inside", op.inside)):
        if frame is not None:
            fields[name] = {"file": frame.file, "line": frame.line, "function": frame.function}
    return fields


def _plain(value: object) -> Any:
    """``value`` as JSON data; anything JSON cannot hold becomes its ``str``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or Infinity
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Enum):
        return _plain(value.value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)  # sets have no stable order
    return str(value)
