"""`dl2 analyze RUN_DIR | DUMPS...`: post-mortem analysis of a recorded run, or of
PyTorch Flight Recorder dumps (told apart by content)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from dl2.analysis import analyze
from dl2.cli.options import add_hazards
from dl2.cli.options import add_json
from dl2.cli.output import emit
from dl2.cli.output import ended_verdict
from dl2.cli.output import job_facts
from dl2.cli.output import write_html_or_fail
from dl2.errors import ConfigError
from dl2.flight.loader import is_flight_input
from dl2.flight.loader import load_flight_session
from dl2.model.incremental import stream_run
from dl2.trace.session import read_run_meta
from dl2.trace.session import run_quiet


class AnalyzeCommand:
    name = "analyze"
    help = "analyse a recorded run directory (or Flight Recorder dumps) and print the diagnosis"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "run_dir",
            nargs="+",
            metavar="RUN_DIR",
            help="a run directory written by `dl2 run`, or PyTorch Flight Recorder dumps: "
            "a directory of per-rank dump files or the files (pickle or JSON)",
        )
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
        paths: list[str] = args.run_dir
        if is_flight_input(paths):
            report = analyze(load_flight_session(paths), hazards=args.hazards)
            emit(report, args.json, args.renderer, args.output)
            if args.html:
                write_html_or_fail(report, args.html, None)
            return report.exit_code
        # the traces are read through the incremental model, a chunk of each at a time
        run_dir = paths[0]
        session, graph = stream_run(run_dir)
        meta = read_run_meta(run_dir)
        report = analyze(session, graph=graph, quiet=run_quiet(meta), hazards=args.hazards)
        # as `dl2 run` concluded: a job that failed or was stopped is not ok
        report = ended_verdict(report, meta.get("reason"), meta.get("job_exit_code"))
        facts = job_facts(meta.get("command"), meta.get("reason"), meta.get("job_exit_code"))
        report = replace(report, job=facts)
        emit(report, args.json, args.renderer, args.output)
        if args.html:
            write_html_or_fail(report, args.html, graph)
        return report.exit_code
