"""`dl2 dump FILE`: print a trace file's records, one per line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dl2.trace.format import read_trace_file


class DumpCommand:
    name = "dump"
    help = "print the records of one rank's trace file"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", help="a *.dl2.jsonl trace file")
        parser.add_argument(
            "--kind", action="append", help="only records of this kind (repeatable)"
        )

    def run(self, args: argparse.Namespace) -> int:
        trace = read_trace_file(args.file)  # checks the whole file first
        # Printed as written (keys sorted), fields this dl2 does not know included.
        lines = Path(args.file).read_bytes().split(b"\n")
        print(json.dumps(json.loads(lines[0]), sort_keys=True))
        for record, line in zip(trace.records, lines[1:], strict=False):
            if args.kind and record.kind not in args.kind:
                continue
            print(json.dumps(json.loads(line), sort_keys=True))
        if trace.truncated:
            print(f"# {trace.truncated}")
        return 0
