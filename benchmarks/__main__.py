"""Run benchmark suites: ``python -m benchmarks [SUITE ...] [OPTIONS]`` (``make bench``).

Each suite is a module of this package with ``main(argv) -> int``.  The leading
arguments name suites; everything from the first option on goes to each of them as is
(``python -m benchmarks eval --filter send_send --anchors``).  With no suite named, every
suite runs in turn with the options of a full benchmark (the evaluation with its
anchors; 35-45 min on 2 cores, depending on the machine's load, plus about 15 min for
``scale``); ``--quick`` alone runs each one's quick subset, without the anchors (about
3.5 min, plus about 2.5 min for ``scale``).  Results go to stdout; the evaluation also
appends to ``benchmarks/results/results.jsonl`` and, for a full run, rewrites its table
in docs/benchmarks.md; ``scale`` appends to ``benchmarks/results/scale.jsonl`` (and
rewrites its section of docs/benchmarks.md with ``--docs``).
"""

from __future__ import annotations

import importlib
import sys
import time

#: suite name -> module under benchmarks/
SUITES = {
    "record": "benchmarks.record_overhead",
    "eval": "benchmarks.evaluate",
    "online": "benchmarks.online",
    "nondet": "benchmarks.nondeterminism",
    "scale": "benchmarks.scale",
    "model": "benchmarks.model_scale",
    "tracesize": "benchmarks.trace_size",
    "model_feed": "benchmarks.model_feed",
}
#: options a suite gets when it runs as part of the whole benchmark (no suite named)
FULL_RUN_OPTIONS = {"eval": ["--anchors"]}


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(suite names, options): the names are the arguments before the first option."""
    names: list[str] = []
    for i, arg in enumerate(argv):
        if arg.startswith("-"):
            return names, argv[i:]
        names.append(arg)
    return names, []


def main(argv: list[str]) -> int:
    names, options = split_args(argv)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"benchmarks: unknown suite {unknown[0]!r}; choose from {', '.join(SUITES)}")
        return 2
    if names:
        plan = [(n, options) for n in names]
    elif "--quick" in options:
        plan = [(n, options) for n in SUITES]
    else:
        plan = [(n, FULL_RUN_OPTIONS.get(n, []) + options) for n in SUITES]
    status = 0
    started = time.monotonic()
    times = []
    for name, suite_options in plan:
        print(f"== benchmark suite: {name} {' '.join(suite_options)}".rstrip(), flush=True)
        t0 = time.monotonic()
        module = importlib.import_module(SUITES[name])
        status = max(status, int(module.main(list(suite_options)) or 0))
        times.append(f"{name} {(time.monotonic() - t0) / 60:.1f} min")
    print(
        f"== benchmarks done in {(time.monotonic() - started) / 60:.1f} min "
        f"({', '.join(times)}), exit status {status}",
        flush=True,
    )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
