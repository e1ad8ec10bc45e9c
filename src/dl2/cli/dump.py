"""`dl2 dump FILE`: print a trace file's records, one per line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dl2.trace.format import read_trace_file
from dl2.trace.schema.decode import record_to_dict


class DumpCommand:
    name = "dump"
    help = "print the records of one rank's trace file (one segment)"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", help="a *.dl2.jsonl trace file")
        parser.add_argument(
            "--kind", action="append", help="only records of this kind (repeatable)"
        )
        parser.add_argument(
            "--raw",
            action="store_true",
            help="the lines as written (compact: interned stacks, deltas), not the records",
        )

    def run(self, args: argparse.Namespace) -> int:
        trace = read_trace_file(args.file)  # checks the whole file first
        lines = Path(args.file).read_bytes().split(b"\n")
        print(json.dumps(json.loads(lines[0]), sort_keys=True))
        if args.raw:
            for line in lines[1:]:
                if line:
                    print(line.decode(errors="replace"))
            return 0
        # Each record as a JSON object with the fields' names, keys sorted.
        for record in trace.records:
            if args.kind and record.kind not in args.kind:
                continue
            print(json.dumps(record_to_dict(record), sort_keys=True, ensure_ascii=False))
        for warning in trace.warnings:
            print(f"# {warning}")
        if trace.truncated:
            print(f"# {trace.truncated}")
        return 0
