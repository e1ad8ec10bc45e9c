"""The model alone: typed records fed in memory, then the analysis ``dl2 analyze`` runs.

Run ``python -m benchmarks model_feed [--quick] [--runs=N] [--history=N,...]
[--world=W,...] [--window=N|none] [--before=SRC]`` (``OMP_NUM_THREADS=1``;
``--before``: a source tree of dl2, such as an exported older commit's ``src``, run
interleaved with this one, run for run, and the ratio given).  No file is written or
decoded: the records are the typed records of :mod:`dl2.trace.schema.decode`, built the
way ``tests/trace_builders.py`` writes them (``RankBuilder.call``: op, ret, wait, ret),
and fed to :class:`dl2.model.incremental.Model` the way ``dl2 analyze``'s reader feeds
them (:func:`dl2.trace.stream.stream_session`: round-robin, a chunk of each rank per
round, a chunk being what its read size holds: 8,192 records for a few ranks, 32 for
8,192 ranks).  Then :func:`dl2.analysis.analyze` runs on the model's graph, as
``dl2 analyze`` calls it, and the report is rendered as text and JSON (in memory).

Shapes (as ``benchmarks/model_scale.py``): *history*, 8 ranks of N blocking
``all_reduce`` calls, then a ring of blocking sends (a deadlock); *world*, W ranks of
100 calls, then the same ring over all W ranks.  Defaults: history 1,000,000 and world
8,192; ``--quick``: 100,000 and 1,024.

**What is timed.** The records are never all held at once: each round (one chunk of
every rank) is built, then fed, and only the feeding is timed (``time.process_time``
around the round's feed calls), so building the records costs nothing in the figure;
then the analysis and the rendering are timed.  records/s is the records of all ranks
(headers excluded) over that CPU time.  Each run is a fresh subprocess; peak RSS is its
``ru_maxrss`` (which includes one round of records, a few MiB).  Each shape runs
``--runs`` times (default 5; median and min-max shown).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: records of one rank per round (what a read of its file holds)
CHUNK_FEW = 8192
CHUNK_MANY = 32


def _chunk(world: int) -> int:
    # stream_session reads min(1 MiB, max(4 KiB, 16 MiB / files)) of each file a round;
    # a record of these traces is about 128 bytes on disk
    return CHUNK_FEW if world <= 64 else CHUNK_MANY


def rank_records(rank: int, world: int, ops: int) -> Iterator[list[object]]:
    """One rank's records, a list per op (as ``RankBuilder.call`` writes them), then
    the blocking send of the ring, whose wait never returns."""
    from dl2.trace.schema.decode import Frame
    from dl2.trace.schema.decode import OpRecord
    from dl2.trace.schema.decode import RetRecord
    from dl2.trace.schema.decode import WaitRecord

    stacks = [(Frame("train.py", 10 + i, "main"),) for i in range(7)]
    t = 0
    for k in range(ops):
        op_id, wait_id = 2 * k + 1, 2 * k + 2
        yield [
            OpRecord(
                id=op_id,
                t=t + 1000,
                tid=1,
                gid="0",
                seq=k,
                op="all_reduce",
                api="all_reduce",
                redop="sum",
                dtype="float32",
                count=4,
                stack=stacks[k % 7],
            ),
            RetRecord(id=op_id, t=t + 2000),
            WaitRecord(id=wait_id, t=t + 3000, tid=1, work=op_id),
            RetRecord(id=wait_id, t=t + 4000),
        ]
        t += 4000
    op_id, wait_id = 2 * ops + 1, 2 * ops + 2
    yield [
        OpRecord(
            id=op_id,
            t=t + 1000,
            tid=1,
            gid="0",
            seq=0,
            op="send",
            api="send",
            peer=(rank + 1) % world,
            tag=0,
            dtype="float32",
            count=4,
            stack=(Frame("train.py", 99, "main"),),
        ),
        RetRecord(id=op_id, t=t + 2000),
        WaitRecord(id=wait_id, t=t + 3000, tid=1, work=op_id),
    ]


def chunks(rank: int, world: int, ops: int, size: int) -> Iterator[list[object]]:
    """The rank's records in chunks of about ``size``."""
    chunk: list[object] = []
    for records in rank_records(rank, world, ops):
        chunk.extend(records)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def as_calls(chunk: list[object]) -> list[tuple[list[object], list[int]] | list[object]]:
    """A chunk as pieces for :meth:`Model.feed_calls` (``(ops, wait ids)``: each
    blocking call of four records) and :meth:`Model.feed` (the other records)."""
    from dl2.trace.schema.decode import OpRecord
    from dl2.trace.schema.decode import RetRecord
    from dl2.trace.schema.decode import WaitRecord

    pieces: list[tuple[list[object], list[int]] | list[object]] = []
    ops: list[object] = []
    waits: list[int] = []
    other: list[object] = []
    i = 0
    while i < len(chunk):
        rec, unit = chunk[i], chunk[i : i + 4]
        if (
            type(rec) is OpRecord
            and len(unit) == 4
            and type(unit[1]) is RetRecord
            and type(unit[2]) is WaitRecord
            and type(unit[3]) is RetRecord
            and unit[3].err is None  # type: ignore[attr-defined]
            and unit[3].src is None  # type: ignore[attr-defined]
        ):
            if other:
                pieces.append(other)
                other = []
            ops.append(rec)
            waits.append(unit[2].id)  # type: ignore[attr-defined]
            i += 4
            continue
        if ops:
            pieces.append((ops, waits))
            ops, waits = [], []
        other.append(rec)
        i += 1
    pieces.append((ops, waits) if ops else other)
    return pieces


def check_records() -> None:
    """The records built here are those the test builders write, read back."""
    sys.path.insert(0, str(REPO / "tests"))
    from trace_builders import RankBuilder

    world, ops = 3, 9
    for rank in range(world):
        builder = RankBuilder(rank, world)
        for done in range(ops):
            builder.call("all_reduce", 10 + done % 7, redop="sum")
        builder.call("send", 99, peer=(rank + 1) % world, complete=False)
        expected = list(builder.trace().records)
        built = [r for c in chunks(rank, world, ops, 5) for r in c]
        assert built == expected, (rank, built[:4], expected[:4])


def one_run(world: int, ops: int, window: int | None, calls: bool = False) -> dict[str, object]:
    """Feed and analyse one shape in this process; the figures as a dict."""
    import resource

    from dl2.analysis import analyze
    from dl2.model.incremental import Model
    from dl2.render import get_renderer
    from dl2.trace.format import RankTrace
    from dl2.trace.schema import FORMAT_VERSION
    from dl2.trace.schema import MAGIC
    from dl2.trace.schema.decode import Header
    from dl2.trace.session import build_session
    from dl2.trace.session import run_quiet

    headers = [
        Header(magic=MAGIC, format=FORMAT_VERSION, rank=r, world_size=world, pid=1000 + r)
        for r in range(world)
    ]
    keys = [f"rank{r:05d}" for r in range(world)]
    model = Model(window=window)
    size = _chunk(world)
    streams = [chunks(r, world, ops, size) for r in range(world)]
    feed = model.feed
    feed_calls = model.feed_calls if calls else None  # an older tree has none
    clock = time.process_time
    fed = 0.0
    records = 0
    reading = list(range(world))
    while reading:
        built = []
        for r in reading:
            chunk = next(streams[r], None)
            built.append((r, chunk))
        reading = [r for r, c in built if c is not None]
        records += sum(len(c) for _, c in built if c is not None)
        if calls:
            pieces = [(r, as_calls(c) if c is not None else [[]]) for r, c in built]
            del built
            started = clock()
            for r, parts in pieces:
                for part in parts:
                    if type(part) is tuple:
                        feed_calls(keys[r], headers[r], part[0], part[1])  # type: ignore[misc]
                    else:
                        feed(keys[r], headers[r], part, None)
            fed += clock() - started
            del pieces
            continue
        started = clock()
        for r, chunk in built:
            feed(keys[r], headers[r], chunk if chunk is not None else [], None)
        fed += clock() - started
        del built
    started = clock()
    session = build_session([RankTrace(keys[r], headers[r], ()) for r in range(world)], {})
    report = analyze(session, graph=model.graph(), quiet=run_quiet({}), hazards=True)
    rendering = clock()
    text = get_renderer("text").render_for(report, tty=False)
    document = get_renderer("json").render_for(report, tty=False)
    analysed = clock() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cycle = json.loads(document)["findings"][0]["ranks"] if report.findings else []
    return {
        "records": records,
        "feed_s": fed,
        "analysis_s": analysed,
        "render_s": analysed - (rendering - started),
        "verdict": report.verdict.value,
        "cycle": len(cycle),
        "text_bytes": len(text),
        "peak_rss_mib": peak / 1024,
    }


def _run(
    world: int, ops: int, window: int | None, src: str | None, calls: bool = False
) -> dict[str, object]:
    """One run in a fresh process (``src``: import dl2 from this source tree instead)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([src, str(REPO)])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.model_feed",
            "--one",
            str(world),
            str(ops),
            str(window),
            *(["calls"] if calls else []),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise SystemExit(f"model_feed run failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _summary(results: list[dict[str, object]]) -> dict[str, object]:
    records = int(results[0]["records"])  # type: ignore[call-overload]
    # feed and analyze(); rendering the report (text and JSON) is given apart
    totals = [
        float(r["feed_s"]) + float(r["analysis_s"]) - float(r["render_s"])  # type: ignore[arg-type]
        for r in results
    ]
    rates = sorted(records / t for t in totals)
    rendered = sorted(
        records / (float(r["feed_s"]) + float(r["analysis_s"]))  # type: ignore[arg-type]
        for r in results
    )
    feed_rates = sorted(records / float(r["feed_s"]) for r in results)  # type: ignore[arg-type]
    return {
        "records_per_cpu_s": round(statistics.median(rates)),
        "rate_min_max": [round(rates[0]), round(rates[-1])],
        "feed_records_per_cpu_s": round(statistics.median(feed_rates)),
        "with_render_records_per_cpu_s": round(statistics.median(rendered)),
        "feed_s": round(statistics.median(float(r["feed_s"]) for r in results), 2),  # type: ignore[arg-type]
        "analyze_s": round(
            statistics.median(float(r["analysis_s"]) - float(r["render_s"]) for r in results),  # type: ignore[arg-type]
            3,
        ),
        "render_s": round(statistics.median(float(r["render_s"]) for r in results), 3),  # type: ignore[arg-type]
        "peak_rss_mib": round(max(float(r["peak_rss_mib"]) for r in results)),  # type: ignore[arg-type]
        "verdict": results[0]["verdict"],
        "cycle": results[0]["cycle"],
    }


def measure(
    world: int, ops: int, window: int | None, runs: int, before: str | None, calls: bool = False
) -> dict[str, object]:
    """``runs`` fresh processes of one shape: medians and spreads; with ``before`` (a
    source tree), each run of this tree follows one of that tree, and the ratios are
    given."""
    mine: list[dict[str, object]] = []
    theirs: list[dict[str, object]] = []
    for _ in range(runs):
        if before is not None:
            theirs.append(_run(world, ops, window, before))
        mine.append(_run(world, ops, window, None, calls))
    row: dict[str, object] = {
        "ranks": world,
        "ops_per_rank": ops,
        "window": window,
        "records": mine[0]["records"],
        "runs": runs,
        **_summary(mine),
    }
    if before is not None:
        old = _summary(theirs)
        row["before"] = old
        row["speedup"] = round(
            float(row["records_per_cpu_s"]) / float(old["records_per_cpu_s"]),  # type: ignore[arg-type]
            2,
        )
    print(json.dumps(row), flush=True)
    return row


def _option(argv: list[str], name: str) -> str | None:
    prefix = f"--{name}="
    return next((a[len(prefix) :] for a in argv if a.startswith(prefix)), None)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        world, ops, window = int(argv[1]), int(argv[2]), argv[3]
        calls = argv[4:5] == ["calls"]
        row = one_run(world, ops, None if window == "None" else int(window), calls)
        print(json.dumps(row), flush=True)
        return 0
    from dl2.model.incremental import DEFAULT_WINDOW

    quick = "--quick" in argv
    check_records()
    runs = int(_option(argv, "runs") or 5)
    given = _option(argv, "window")
    window = DEFAULT_WINDOW if given is None else None if given == "none" else int(given)
    history = _option(argv, "history")
    world = _option(argv, "world")
    default = 100_000 if quick else 1_000_000
    histories = [int(n) for n in history.split(",")] if history else [default]
    worlds = [int(n) for n in world.split(",")] if world else [1024 if quick else 8192]
    print("== model_feed: typed records in memory -> Model.feed -> analyze -> report")
    before = _option(argv, "before")
    calls = _option(argv, "entry") == "calls"
    for ops in histories:
        if ops:
            measure(8, ops, window, runs, before, calls)
    for size in worlds:
        if size:
            measure(size, 100, window, runs, before, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
