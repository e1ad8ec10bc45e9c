"""The dl2 command line: one module per subcommand over the public API."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence
from typing import Protocol

from dl2._version import __version__
from dl2.errors import Dl2Error


class Command(Protocol):
    """A subcommand: adds its arguments, then runs and returns an exit status."""

    name: str
    help: str

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line and exits with status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"dl2: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def _commands() -> list[Command]:
    from dl2.cli.analyze import AnalyzeCommand
    from dl2.cli.dump import DumpCommand
    from dl2.cli.export import ExportCommand
    from dl2.cli.predict import PredictCommand
    from dl2.cli.replay import ReplayCommand
    from dl2.cli.run import RunCommand

    return [
        RunCommand(),
        AnalyzeCommand(),
        DumpCommand(),
        PredictCommand(),
        ReplayCommand(),
        ExportCommand(),
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dl2",
        description="Find communication deadlocks and mismatches in distributed PyTorch jobs.",
    )
    parser.add_argument("--version", action="version", version=f"dl2 {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in _commands():
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        command.prepare_parser(child)
        child.set_defaults(handler=command)
    return parser


#: the youngest generation's collection threshold in dl2's own process (Python's is 700)
GC_THRESHOLD = 50_000


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dl2`` console script; returns the exit status."""
    # The model of a large run holds millions of small objects (ops, records, ranks'
    # state), none of them in reference cycles: with Python's threshold the collector
    # walked them over and over (about 40 % of the CPU time of the analysis of 8,192
    # ranks once the traces were read); young objects are still collected, 70 times
    # less often.
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, middle, old)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(handler.run(args))
    except Dl2Error as err:
        print(f"dl2: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("dl2: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of our output went away (`dl2 dump ... | head`): stop quietly, and
        # keep the interpreter's last flush from failing again
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141  # 128 + SIGPIPE, as a shell reports a pipe's writer killed by it
