"""Arguments several subcommands share, and their value types."""

from __future__ import annotations

import argparse

from dl2.errors import ConfigError
from dl2.units import parse_size


def positive(text: str) -> float:
    """A positive number of seconds (an argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def byte_size(text: str) -> int:
    """A byte size such as ``4095`` or ``64KiB`` (an argparse type)."""
    try:
        return parse_size(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("not a byte size: ")) from None


def add_run_dir(parser: argparse.ArgumentParser) -> None:
    """The positional RUN_DIR: a recorded run to read."""
    parser.add_argument("run_dir", help="a run directory written by `dl2 run`")


def add_json(parser: argparse.ArgumentParser) -> None:
    """``--json PATH``: the JSON report, besides the console view."""
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")


def add_monitoring(parser: argparse.ArgumentParser, hang_timeout_help: str) -> None:
    """The live monitor's ``--hang-timeout`` and (hidden) ``--poll-interval``."""
    parser.add_argument(
        "--hang-timeout", type=positive, default=60.0, metavar="S", help=hang_timeout_help
    )
    parser.add_argument(
        "--poll-interval", type=positive, default=0.2, metavar="S", help=argparse.SUPPRESS
    )


def add_buffer_size(parser: argparse.ArgumentParser, help: str) -> None:
    """``--buffer-size BYTES``: the eager sends to emulate."""
    parser.add_argument("--buffer-size", type=byte_size, metavar="BYTES", help=help)


def add_hazards(parser: argparse.ArgumentParser) -> None:
    """``--no-hazards``: report only what the run did, not what it would do elsewhere."""
    parser.add_argument(
        "--no-hazards",
        dest="hazards",
        action="store_false",
        help=(
            "do not report hazards the run did not hit (deadlocks under NCCL or with "
            "unbuffered sends: cross-group collective orders, split batches, exchanges "
            "that rely on buffering, wildcard races)"
        ),
    )
