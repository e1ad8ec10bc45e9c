"""The Renderer base class and :func:`write_report`, which puts a rendered report somewhere."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import ClassVar
from typing import TextIO

from dl2.errors import Dl2Error
from dl2.report import Report

#: The output name that means standard output.
STDOUT = "-"


class Renderer:
    """Turns a :class:`~dl2.report.Report` into text. Formatting only.

    A renderer shows what the report says and never recomputes it.  Options are set on
    the instance; per-render state stays local to :meth:`render`, so one instance can
    render many reports.
    """

    #: the name ``-r`` selects it by (a key of ``dl2.render.RENDERERS``)
    name: ClassVar[str]
    #: file extension of its output, without the dot
    output_file_extension: ClassVar[str] = "txt"

    def render(self, report: Report) -> str:
        """Return the whole report as text, ending with a newline.

        The same report always renders to the same text: no times, no environment.
        """
        raise NotImplementedError

    def render_for(self, report: Report, *, tty: bool) -> str:
        """Render for a destination that is (``tty=True``) or is not a terminal.

        :func:`write_report` calls this; a renderer whose output depends on the
        destination (colours) overrides it.  By default it is :meth:`render`.
        """
        return self.render(report)


def write_report(renderer: Renderer, report: Report, output: str | os.PathLike[str] | None) -> None:
    """Render ``report`` and write it to ``output``.

    Args:
        renderer: the renderer to use.
        report: what to render.
        output: a file path; ``"-"`` or None means standard output.  Missing parent
            directories are created; an existing file is replaced.

    Raises:
        Dl2Error: the output could not be written (the message names it and says why).
            A file left half-written is removed first.
    """
    if output is None or os.fspath(output) == STDOUT:
        stream = sys.stdout
        _write_stream(stream, renderer.render_for(report, tty=_isatty(stream)))
        return
    # Render before touching the file: a renderer that fails leaves nothing behind.
    text = renderer.render_for(report, tty=False)
    _write_file(Path(output), text)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def _write_stream(stream: TextIO, text: str) -> None:
    try:
        try:
            stream.write(text)
        except UnicodeEncodeError:
            # A terminal or pipe whose encoding lacks "→" or "⇢": degrade, don't fail.
            encoding = getattr(stream, "encoding", None) or "ascii"
            stream.write(text.encode(encoding, "replace").decode(encoding))
        stream.flush()
    except OSError as err:
        raise Dl2Error(f"cannot write the report to standard output: {_reason(err)}") from err


def _write_file(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        file = open(path, "w", encoding="utf-8", errors="backslashreplace", newline="\n")  # noqa: SIM115
    except OSError as err:
        raise Dl2Error(f"cannot write the report to {path}: {_reason(err)}") from err
    try:
        with file:
            file.write(text)
    except BaseException as err:
        _remove_partial(path)
        if isinstance(err, OSError):
            raise Dl2Error(f"cannot write the report to {path}: {_reason(err)}") from err
        raise


def _remove_partial(path: Path) -> None:
    """Remove a half-written report, but only a regular file (never /dev/stdout or a FIFO)."""
    try:
        if stat.S_ISREG(path.stat().st_mode):
            path.unlink()
    except OSError:
        pass  # the original error is the one worth reporting


def _reason(err: OSError) -> str:
    return err.strerror or str(err) or type(err).__name__
