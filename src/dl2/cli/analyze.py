"""`dl2 analyze RUN_DIR`: post-mortem analysis of a recorded run."""

from __future__ import annotations

import argparse

from dl2.analysis import analyze
from dl2.cli.options import add_hazards
from dl2.cli.options import add_json
from dl2.cli.options import add_run_dir
from dl2.cli.output import emit
from dl2.cli.output import write_html
from dl2.errors import ConfigError
from dl2.model.incremental import stream_run
from dl2.trace.session import read_run_meta
from dl2.trace.session import run_quiet


class AnalyzeCommand:
    name = "analyze"
    help = "analyse a recorded run directory and print the diagnosis"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser)
        add_json(parser)
        add_hazards(parser)
        parser.add_argument(
            "-r",
            "--renderer",
            default="text",
            choices=["text", "json"],
            help="output format (default text)",
        )
        parser.add_argument(
            "-o", "--output", metavar="PATH", help="write the output here instead of stdout"
        )
        parser.add_argument(
            "--html",
            metavar="FILE",
            help="also write the report as one self-contained HTML page (needs dl2[html])",
        )

    def run(self, args: argparse.Namespace) -> int:
        if args.html:
            from dl2.render.html import html_available

            missing = html_available()
            if missing is not None:
                raise ConfigError(f"--html: {missing}")
        # the traces are read through the incremental model, a chunk of each at a time
        session, graph = stream_run(args.run_dir)
        report = analyze(
            session, graph=graph, quiet=run_quiet(read_run_meta(args.run_dir)), hazards=args.hazards
        )
        emit(report, args.json, args.renderer, args.output)
        if args.html:
            write_html(report, args.html, graph)
        return report.exit_code
