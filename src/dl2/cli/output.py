"""Showing a report: the console view on stdout, the JSON file where asked.

:func:`conclude` and :func:`exit_status` finish the report of a job the live monitor
followed, the same way for ``dl2 run`` and ``dl2 replay``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from dl2.errors import Dl2Error
from dl2.notice import notice
from dl2.render import get_renderer
from dl2.render import write_report
from dl2.report import Report
from dl2.report import Verdict

if TYPE_CHECKING:
    from dl2.live.monitor import Outcome
    from dl2.model.execution_graph import ExecutionGraph

#: the HTML report ``dl2 run`` writes beside ``report.json``
REPORT_HTML = "report.html"


def emit(
    report: Report,
    json_path: str | None,
    renderer_name: str = "text",
    output: str | None = None,
) -> None:
    """Print (or write) the report, and write its JSON form to ``json_path`` if given."""
    write_report(get_renderer(renderer_name), report, output)
    if json_path:
        write_report(get_renderer("json"), report, json_path)


def ended_verdict(report: Report, reason: Any, job_exit_code: Any) -> Report:
    """The report of a job that ended so (a monitored run's reason and exit status, or
    run.json's): one that failed or was stopped is never ``ok`` (``hang`` when dl2's hang
    timeout stopped it, else ``job-failed``); unknown ones change nothing."""
    if report.verdict is not Verdict.OK or not isinstance(reason, str):
        return report
    if reason == "hang-timeout":
        # every live rank sat in calls the model saw matched, yet none returned
        return replace(report, verdict=Verdict.HANG)
    if reason != "finished" or (isinstance(job_exit_code, int) and job_exit_code != 0):
        return replace(report, verdict=Verdict.JOB_FAILED)
    return report


def job_facts(command: Any, reason: Any, exit_status: Any) -> dict[str, object]:
    """The report's ``job``: what the launcher saw of the job (its command, how it
    ended, its exit status), from a monitored run or its run.json."""
    facts: dict[str, object] = {}
    if isinstance(command, list) and command:
        facts["command"] = [str(part) for part in command]
    if isinstance(reason, str):
        facts["ended"] = reason
    if isinstance(exit_status, int) and reason == "finished":  # not what dl2's stop left
        facts["exit_status"] = exit_status
    return facts


def conclude(
    outcome: Outcome,
    report: Report,
    run_dir: Path,
    json_path: str | None,
    stop_notes: Mapping[str, str],
    command: list[str] | None = None,
) -> Report:
    """Finish, show and save the report of a monitored run; returns it as shown.

    The monitor's notes and why dl2 stopped the job (``outcome.stop_note``, else
    ``stop_notes[outcome.reason]``)
    become warnings; a job that failed or was stopped is never ``ok`` (``hang`` when
    dl2's hang timeout stopped it, else ``job-failed``).  The report is
    printed, written to ``json_path`` if given and always to ``run_dir/report.json``,
    and drawn in ``run_dir/report.html`` (:func:`write_html_quietly`).
    """
    why = outcome.stop_note or stop_notes.get(outcome.reason)
    extra = [*outcome.notes, *([why] if why is not None else [])]
    if extra:
        report = replace(report, warnings=(*report.warnings, *extra))
    report = ended_verdict(report, outcome.reason, outcome.job_exit_code)
    report = replace(report, job=job_facts(command, outcome.reason, outcome.job_exit_code))
    try:
        write_report(get_renderer("json"), report, str(run_dir / "report.json"))
    except Dl2Error:
        pass  # the run directory went away; the report is printed below
    write_html_quietly(report, run_dir / REPORT_HTML, outcome.graph)
    write_report(get_renderer("text"), report, None)
    if json_path:
        try:
            write_report(get_renderer("json"), report, json_path)
        except Dl2Error as err:  # the job ran: its verdict (and exit status) stand
            print(f"dl2: {err} (the report is in {run_dir / 'report.json'})", file=sys.stderr)
    return report


def write_html(report: Report, path: str | Path, graph: ExecutionGraph | None = None) -> None:
    """Render the HTML report and write it to ``path`` (``dl2 analyze --html``).

    Raises:
        ConfigError: the ``html`` extra is missing.  Dl2Error: the file cannot be written.
    """
    from dl2.render.html import HtmlRenderer

    write_report(HtmlRenderer(graph=graph), report, str(path))


def write_html_or_fail(report: Report, path: str, graph: ExecutionGraph | None) -> None:
    """:func:`write_html` for ``dl2 analyze --html``: a bug in the renderer is one line
    and exit 2 (:class:`Dl2Error`), never a traceback."""
    try:
        write_html(report, path, graph)
    except Dl2Error:
        raise
    except Exception as err:
        raise Dl2Error(f"{path}: HTML report not written: {err!r}") from None


def write_html_quietly(report: Report, path: Path, graph: ExecutionGraph | None) -> bool:
    """:func:`write_html`, but a failure (the extra missing, a full disk, a bug in the
    renderer) is one line on stderr, never an error of the job's run; True if written."""
    try:
        write_html(report, path, graph)
    except Exception as err:
        reason = str(err) or type(err).__name__
        notice(f"{path.name} not written: {reason}")
        try:
            path.unlink(missing_ok=True)  # no page of an earlier run in a reused directory
        except OSError:
            pass
        return False
    return True


def exit_status(outcome: Outcome, report: Report) -> int:
    """dl2's exit status: the report's verdict's (130 for ``interrupted``)."""
    return report.exit_code
