"""The renderer registry, write_report, and what every renderer must do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dl2.render.base as base
from builders import rank_state
from builders import report
from dl2.errors import ConfigError
from dl2.errors import Dl2Error
from dl2.render import RENDERERS
from dl2.render import ConsoleRenderer
from dl2.render import JsonRenderer
from dl2.render import Renderer
from dl2.render import get_renderer
from dl2.render import write_report
from dl2.report import Report

EMPTY = report()
SINGLE = report(ranks=[rank_state(0, "exited")])


class Fixed(Renderer):
    """Renders every report as the same text."""

    name = "fixed"

    def __init__(self, text: str = "report\n") -> None:
        self.text = text

    def render(self, report: Report) -> str:
        return self.text


# -- registry -----------------------------------------------------------------------------


def test_registry_names_and_classes() -> None:
    assert {"text": ConsoleRenderer, "json": JsonRenderer} == RENDERERS
    for name, cls in RENDERERS.items():
        assert cls.name == name
        assert type(get_renderer(name)) is cls


def test_get_renderer_passes_options() -> None:
    renderer = get_renderer("text", color=True, width=80)
    assert isinstance(renderer, ConsoleRenderer)
    assert (renderer.color, renderer.width) == (True, 80)


def test_get_renderer_unknown_name_lists_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown renderer 'html': choose one of json, text"):
        get_renderer("html")


def test_importing_render_does_not_import_rich() -> None:
    # GIVEN a fresh interpreter WHEN dl2.render is imported and a JSON report rendered
    code = (
        "import sys, dl2.render as r; from dl2.report import Report, Verdict;"
        "r.JsonRenderer().render(Report(Verdict.OK, (), (), 0));"
        "print('rich' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # THEN rich was never loaded: only the console renderer needs it
    assert out.stdout.strip() == "False"


# -- every renderer -----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(RENDERERS))
@pytest.mark.parametrize("rep", [EMPTY, SINGLE], ids=["empty", "single-rank"])
def test_every_renderer_renders_small_reports(name: str, rep: Report) -> None:
    renderer = get_renderer(name)
    text = renderer.render(rep)
    assert text.endswith("\n")
    assert text == renderer.render(rep), "the same report must render the same way"
    assert text == get_renderer(name).render(rep), "render state must not live on instances"
    assert renderer.render_for(rep, tty=False) == text


def test_base_render_is_abstract() -> None:
    with pytest.raises(NotImplementedError):
        Renderer().render(EMPTY)


# -- write_report -------------------------------------------------------------------------


def test_write_report_to_file_creates_parent_dirs(tmp_path: Path) -> None:
    # GIVEN an output path whose directories do not exist yet
    out = tmp_path / "a" / "b" / "report.json"
    # WHEN the report is written there
    write_report(JsonRenderer(), SINGLE, str(out))
    # THEN the file holds the rendered report
    assert out.read_text(encoding="utf-8") == JsonRenderer().render(SINGLE)


def test_write_report_replaces_existing_file(tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    out.write_text("old content that is longer than the new one\n")
    write_report(Fixed("new\n"), EMPTY, out)
    assert out.read_text() == "new\n"


@pytest.mark.parametrize("output", ["-", None])
def test_write_report_to_stdout(output: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    write_report(ConsoleRenderer(), SINGLE, output)
    out = capsys.readouterr().out
    assert out == ConsoleRenderer().render(SINGLE)
    assert "\x1b[" not in out, "no colours when stdout is not a terminal"


def test_write_report_to_unwritable_path_is_a_clean_error(tmp_path: Path) -> None:
    # GIVEN an output path "under" a regular file, which cannot be a directory
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    out = blocker / "report.txt"
    # WHEN writing there THEN a one-line Dl2Error names the path
    with pytest.raises(Dl2Error) as info:
        write_report(Fixed(), EMPTY, str(out))
    message = str(info.value)
    assert message.startswith(f"cannot write the report to {out}: ")
    assert "\n" not in message


def test_write_report_to_a_directory_is_a_clean_error(tmp_path: Path) -> None:
    with pytest.raises(Dl2Error, match=f"cannot write the report to {tmp_path}: "):
        write_report(Fixed(), EMPTY, tmp_path)
    assert tmp_path.is_dir()


def test_write_report_removes_half_written_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a disk that fills up after the first bytes of the report
    real_open = open

    class FullDisk:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.file = real_open(*args, **kwargs)  # type: ignore[call-overload]

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

        def write(self, text: str) -> int:
            self.file.write(text[:3])
            self.file.flush()
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(base, "open", FullDisk, raising=False)
    out = tmp_path / "report.txt"

    # WHEN the report is written THEN a clean error says why, and no partial file is left
    with pytest.raises(Dl2Error, match="No space left on device"):
        write_report(Fixed("a long report\n"), EMPTY, out)
    assert not out.exists()


def test_write_report_leaves_no_file_when_rendering_fails(tmp_path: Path) -> None:
    class Broken(Renderer):
        name = "broken"

        def render(self, report: Report) -> str:
            raise RuntimeError("renderer bug")

    out = tmp_path / "report.txt"
    with pytest.raises(RuntimeError, match="renderer bug"):
        write_report(Broken(), EMPTY, out)
    assert not out.exists()


def test_write_report_asks_renderer_about_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN standard output that is a terminal
    monkeypatch.setattr(base, "_isatty", lambda stream: True)
    # WHEN a console report with automatic colour is written to it
    write_report(ConsoleRenderer(width=100), SINGLE, "-")
    # THEN it is coloured; to a file it would not be
    assert "\x1b[" in capsys.readouterr().out
