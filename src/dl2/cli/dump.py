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
        trace = read_trace_file(args.file)  # checks the header, notes corrupt lines
        # Printed as written (keys sorted), fields this dl2 does not know included; a
        # corrupt line is named where it stands.
        lines = Path(args.file).read_bytes().split(b"\n")
        print(json.dumps(json.loads(lines[0]), sort_keys=True))
        skipped = dict(trace.skipped)
        records = iter(trace.records)
        for number, line in enumerate(lines[1:], start=2):
            if number in skipped:
                print(f"# {skipped[number]}")
                continue
            if not line:
                continue
            record = next(records, None)
            if record is None:
                break  # a partial or corrupt last line: the note below
            if args.kind and record.kind not in args.kind:
                continue
            print(json.dumps(json.loads(line), sort_keys=True))
        if trace.truncated:
            print(f"# {trace.truncated}")
        return 0
