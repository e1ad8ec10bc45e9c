"""`dl2 dump FILE`: print a trace file's records, one per line."""

from __future__ import annotations

import argparse
import json

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
        trace = read_trace_file(args.file)
        print(json.dumps(trace.header, sort_keys=True))
        for record in trace.records:
            if args.kind and record.get("k") not in args.kind:
                continue
            print(json.dumps(record, sort_keys=True))
        if trace.truncated:
            print(f"# {trace.truncated}")
        return 0
