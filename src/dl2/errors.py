"""Exceptions dl2 raises on purpose, each with the CLI exit status it maps to."""

from __future__ import annotations


class Dl2Error(Exception):
    """Base class of all exceptions dl2 raises on purpose.

    The CLI prints ``dl2: <message>`` on one line and exits with ``exit_code``.
    """

    exit_code = 2


class TraceFormatError(Dl2Error):
    """A trace file is foreign, of another format version, or corrupt."""


class NoDataError(Dl2Error):
    """No trace files were found, or they hold no ranks."""


class ConfigError(Dl2Error):
    """Impossible or unknown options."""


class LaunchError(Dl2Error):
    """The job could not be started (missing script, bad command)."""
