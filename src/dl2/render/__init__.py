"""Renderers: turn a :class:`~dl2.report.Report` into text for people or programs.

``RENDERERS`` maps each ``-r`` name to its class; :func:`get_renderer` builds one by name and
:func:`write_report` writes the output to a file or standard output.
"""

from __future__ import annotations

from typing import Any

from dl2.errors import ConfigError
from dl2.render.base import Renderer
from dl2.render.base import write_report
from dl2.render.console import ConsoleRenderer
from dl2.render.jsonreport import JsonRenderer
from dl2.render.jsonreport import report_to_dict

__all__ = [
    "RENDERERS",
    "ConsoleRenderer",
    "JsonRenderer",
    "Renderer",
    "get_renderer",
    "report_to_dict",
    "write_report",
]

#: renderer name (``dl2 analyze -r NAME``) -> its class
RENDERERS: dict[str, type[Renderer]] = {
    "text": ConsoleRenderer,
    "json": JsonRenderer,
}


def get_renderer(name: str, **options: Any) -> Renderer:
    """A new renderer called ``name``, built with ``options``.

    Example: ``get_renderer("text", color=False)``; see each class for its options.

    Raises:
        ConfigError: no renderer has that name (the message lists the valid ones).
    """
    try:
        cls = RENDERERS[name]
    except KeyError:
        valid = ", ".join(sorted(RENDERERS))
        raise ConfigError(f"unknown renderer {name!r}: choose one of {valid}") from None
    return cls(**options)
