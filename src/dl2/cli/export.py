"""`dl2 export RUN_DIR --perfetto FILE`: a recorded run as a trace for a trace viewer."""

from __future__ import annotations

import argparse
import sys

from dl2.analysis import analyze
from dl2.cli.options import add_hazards
from dl2.cli.options import add_run_dir
from dl2.errors import Dl2Error
from dl2.model.execution_graph import build_execution_graph
from dl2.render.perfetto import write_trace
from dl2.trace.session import load_session
from dl2.trace.session import read_run_meta
from dl2.trace.session import run_quiet


class ExportCommand:
    name = "export"
    help = "write a recorded run in another format (the Perfetto / Chrome trace viewer's)"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser)
        add_hazards(parser)
        parser.add_argument(
            "--perfetto",
            metavar="FILE",
            required=True,
            help=(
                "write the Chrome trace event JSON that ui.perfetto.dev and chrome://tracing "
                "open: a track per rank and thread, ops as slices, arrows between matched "
                "ops, findings as instant events ('-': standard output)"
            ),
        )

    def run(self, args: argparse.Namespace) -> int:
        session = load_session(args.run_dir)
        graph = build_execution_graph(session)  # every op: the timeline shows them all
        quiet = run_quiet(read_run_meta(args.run_dir))
        report = analyze(session, graph=graph, quiet=quiet, hazards=args.hazards)
        if args.perfetto == "-":
            count = write_trace(session, graph, report, sys.stdout)
            return 0
        try:
            with open(args.perfetto, "w", encoding="utf-8") as out:
                count = write_trace(session, graph, report, out)
        except OSError as err:
            raise Dl2Error(f"cannot write {args.perfetto}: {err.strerror or err}") from None
        print(f"dl2: wrote {count} trace events to {args.perfetto}", file=sys.stderr)
        return 0
