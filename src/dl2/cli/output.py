"""Showing a report: the console view on stdout, the JSON file where asked."""

from __future__ import annotations

from dl2.render import get_renderer
from dl2.render import write_report
from dl2.report import Report


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
