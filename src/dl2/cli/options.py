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
    if not value > 0 or value == float("inf"):  # nan compares false
        raise argparse.ArgumentTypeError(f"must be a positive, finite number: {text!r}")
    return value


def byte_size(text: str) -> int:
    """A byte size such as ``4095`` or ``64KiB`` (an argparse type)."""
    try:
        return parse_size(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("not a byte size: ")) from None


def keep_count(text: str) -> int:
    """``all`` (0: keep every segment) or a positive number of segments (argparse type)."""
    if text.strip().lower() == "all":
        return 0
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of segments or 'all': {text}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (or 'all'): {text}")
    return value


def add_retention(parser: argparse.ArgumentParser) -> None:
    """``--keep N|all`` and ``--segment-size BYTES``: how much trace each rank keeps."""
    from dl2.record.writer import KEEP
    from dl2.record.writer import SEGMENT_BYTES

    parser.add_argument(
        "--keep",
        type=keep_count,
        metavar="N|all",
        help=(
            f"trace segments each rank keeps (default {KEEP}, of {SEGMENT_BYTES >> 20} MiB "
            "each: the oldest are deleted, so a rank's trace stays under "
            f"{KEEP * SEGMENT_BYTES >> 20} MiB); `all` keeps the whole run, which "
            "`dl2 predict` and `dl2 replay` need"
        ),
    )
    parser.add_argument(
        "--segment-size",
        type=byte_size,
        metavar="BYTES",
        help=argparse.SUPPRESS,  # a segment's size; tests set a tiny one
    )


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
