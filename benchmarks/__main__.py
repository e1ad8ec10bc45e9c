"""Run benchmark suites: ``python -m benchmarks [SUITE ...] [--quick]`` (``make bench``).

Each suite is a module of this package with ``main(argv) -> int``; with no SUITE named,
every suite runs in turn.  Results go to stdout; docs/benchmarks.md records them.
"""

from __future__ import annotations

import importlib
import sys

#: suite name -> module under benchmarks/
SUITES = {
    "record": "benchmarks.record_overhead",
    "eval": "benchmarks.evaluate",
    "online": "benchmarks.online",
    "nondet": "benchmarks.nondeterminism",
}


def main(argv: list[str]) -> int:
    names = [a for a in argv if not a.startswith("-")] or list(SUITES)
    flags = [a for a in argv if a.startswith("-")]
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"benchmarks: unknown suite {unknown[0]!r}; choose from {', '.join(SUITES)}")
        return 2
    status = 0
    for name in names:
        print(f"== benchmark suite: {name}", flush=True)
        module = importlib.import_module(SUITES[name])
        status = max(status, int(module.main(flags) or 0))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
