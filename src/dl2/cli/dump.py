"""`dl2 dump FILE`: print a trace file's records, one per line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dl2.trace.format import TraceReader
from dl2.trace.format import read_trace_file
from dl2.trace.schema import RECORD_KINDS
from dl2.trace.schema.decode import record_to_dict


class DumpCommand:
    name = "dump"
    help = "print the records of one rank's trace file (one segment)"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", help="a *.dl2.jsonl trace file")
        parser.add_argument(
            "--kind",
            action="append",
            choices=sorted(RECORD_KINDS),
            help="only records of this kind (repeatable)",
        )
        parser.add_argument(
            "--raw",
            action="store_true",
            help="the lines as written (compact: interned stacks, deltas), not the records",
        )

    def run(self, args: argparse.Namespace) -> int:
        read_trace_file(args.file)  # checks the header: a clean error if it is not a trace
        lines = Path(args.file).read_bytes().split(b"\n")
        print(json.dumps(json.loads(lines[0]), sort_keys=True))
        if args.raw:
            for line in lines[1:]:
                if line:
                    print(line.decode(errors="replace"))
            return 0
        # Each record as a JSON object with the fields' names, keys sorted; read line by
        # line, so that a corrupt line is named where it stands.
        reader = TraceReader(args.file)
        reader.feed(lines[0] + b"\n")
        rest = b""
        for line in lines[1:-1]:
            data = rest + line + b"\n"
            before, noted = reader.consumed, len(reader.skipped)
            records = reader.feed(data)
            rest = data[reader.consumed - before :]
            for _, note in reader.skipped[noted:]:
                print(f"# {note}")
            for record in records:
                if args.kind and record.kind not in args.kind:
                    continue
                print(json.dumps(record_to_dict(record), sort_keys=True, ensure_ascii=False))
        reader.feed(rest + lines[-1])
        trace = reader.trace(())
        for warning in trace.warnings:
            print(f"# {warning}")
        if trace.truncated:
            print(f"# {trace.truncated}")
        return 0
