"""Anchors: the evaluation's cases without dl2, as a user would debug them today.

``plain`` (gloo defaults), ``detail`` (``TORCH_DISTRIBUTED_DEBUG=DETAIL``) and ``fr``
(a Flight Recorder dump analysed by ``torchfrtrace``); ``benchmarks/evaluate.py`` says
what each counts as detected and as naming the culprit.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks._harness import BENCH
from benchmarks._harness import DL2
from benchmarks._harness import Case
from benchmarks._harness import PlainRun
from benchmarks._harness import launch
from benchmarks.evaluation.results import AnchorResult

FR_HOOK_DIR = BENCH / "_anchor_fr"
#: anchors: a run still going after this long is a hang (and the FR dump is taken then);
#: the workloads get ``WORKLOAD_CAP_S`` (importing transformers took up to 25 s on a
#: loaded 2-core machine)
ANCHOR_CAP_S = 30.0
WORKLOAD_CAP_S = 90.0
#: FR anchor: time allowed after the cap for the ranks to write their dumps
FR_DUMP_GRACE_S = 40.0
#: anchors: at most this many rank processes alive at once (memory), over all workers
ANCHOR_RANK_BUDGET = 20

DETAIL_PATTERNS = (
    re.compile(r"Detected mismatch between collectives"),
    re.compile(r"failed to pass monitoredBarrier"),
)
_RANK_WORD = re.compile(r"\b[Rr]anks?\s+(\d+(?:\s*,\s*\d+)*)")


class _RankBudget:
    """Caps the number of rank processes alive over all anchor workers."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.cond = threading.Condition()

    @contextlib.contextmanager
    def take(self, n: int) -> Any:
        n = min(n, self.budget)
        with self.cond:
            while self.used + n > self.budget:
                self.cond.wait()
            self.used += n
        try:
            yield
        finally:
            with self.cond:
                self.used -= n
                self.cond.notify_all()


def _ranks_in(text: str) -> set[int]:
    ranks: set[int] = set()
    for match in _RANK_WORD.finditer(text):
        ranks.update(int(x) for x in re.split(r"\s*,\s*", match.group(1)))
    return ranks


def anchor_cap(case: Case) -> float:
    """Seconds after which an anchor run of ``case`` counts as a hang."""
    return WORKLOAD_CAP_S if case.suite == "workloads" else ANCHOR_CAP_S


def anchor_plain(case: Case) -> AnchorResult:
    """gloo defaults: detected when a rank fails or prints an error within the cap."""
    run = launch(case.path, case.world, anchor_cap(case))
    shutil.rmtree(run.outdir, ignore_errors=True)
    first_error = run.first_signal_at()
    detected = first_error is not None
    return AnchorResult(
        "plain",
        case.name,
        run.outcome,
        None if first_error is None else round(first_error, 2),
        detected,
        None,
        evidence=_first_error_line(run) or run.describe(),
    )


def _first_error_line(run: PlainRun) -> str:
    for rank in sorted(run.logs):
        for line in run.logs[rank].splitlines():
            if "Error" in line:
                return line.strip()[:200]
    return ""


def anchor_detail(case: Case) -> AnchorResult:
    """``TORCH_DISTRIBUTED_DEBUG=DETAIL``: detected when a rank prints its diagnostics."""
    run = launch(case.path, case.world, anchor_cap(case), {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    shutil.rmtree(run.outdir, ignore_errors=True)
    hits = [
        line
        for rank in sorted(run.logs)
        for line in run.logs[rank].splitlines()
        if any(p.search(line) for p in DETAIL_PATTERNS)
    ]
    named: set[int] = set()
    for line in hits:
        named |= _ranks_in(line)
    first_error = run.first_signal_at()
    return AnchorResult(
        "detail",
        case.name,
        run.outcome,
        None if first_error is None else round(first_error, 2),
        bool(hits),
        (bool(hits) and named >= case.ranks) if case.positive else None,
        sorted(named),
        (hits[0] if hits else _first_error_line(run) or run.describe())[:300],
    )


_FR_LOCK = threading.Lock()


def fr_repair(src: Path, dst: Path, world: int) -> None:
    """Copy the rank dumps of ``src`` to ``dst`` with ``pg_config`` filled from the entries.

    torch 2.13's gloo records ``pg_config`` as one entry ``{"": {"name": "", "desc": "",
    "ranks": <ranks of the group created last>}}`` while entries name their group
    ``("0", "default_pg")``, ``("1", "undefined")``, ...; the analyser then fails on the
    lookup.  Each group seen in the entries gets a config: the default group all
    ``world`` ranks, any other group the ranks whose entries use it.
    """
    dumps = {}
    for path in src.glob("rank_*"):
        if path.suffix == ".tmp":
            continue
        with contextlib.suppress(Exception):
            dumps[path] = pickle.loads(path.read_bytes())
    members: dict[tuple[str, str], set[int]] = {}
    for path, dump in dumps.items():
        rank = int(path.name.rsplit("_", 1)[1])
        for entry in dump.get("entries", []):
            members.setdefault(tuple(entry["process_group"]), set()).add(rank)
    dst.mkdir(parents=True, exist_ok=True)
    for path, dump in dumps.items():
        config = {}
        for (name, desc), ranks in members.items():
            group = list(range(world)) if desc == "default_pg" else sorted(ranks)
            config[name] = {"name": name, "desc": desc, "ranks": str(group)}
        dump["pg_config"] = config
        (dst / path.name).write_bytes(pickle.dumps(dump))


def _torchfrtrace(trace_dir: Path, incomplete: bool) -> str:
    """Run torch's Flight Recorder analyser in process; its log output (or its error)."""
    from torch.distributed.flight_recorder import fr_trace

    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    fr_logger = logging.getLogger("Flight Recorder")
    args = [str(trace_dir), "-p", "rank_"] + (["--allow-incomplete-ranks"] if incomplete else [])
    with _FR_LOCK:
        fr_logger.addHandler(handler)
        saved = list(fr_logger.handlers)
        for other in saved:
            if other is not handler:
                fr_logger.removeHandler(other)
        try:
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                fr_trace.main(args)
        except BaseException as err:  # the analyser raises AssertionError, KeyError, ...
            buffer.write(f"\nANALYSER FAILED: {type(err).__name__}: {err}\n")
        finally:
            for other in saved:
                if other is not handler:
                    fr_logger.addHandler(other)
            fr_logger.removeHandler(handler)
    return buffer.getvalue()


def dl2_on_dumps(case: Case, files: list[Path], outcome: str, time_s: float | None) -> AnchorResult:
    """dl2 itself (``dl2 analyze --json``) on the same Flight Recorder dumps."""
    from benchmarks.evaluation.scoring import score_report  # scoring imports this module

    if not files:
        return AnchorResult("fr-dl2", case.name, outcome, time_s, False, None, [], "no dump")
    report_path = files[0].parent / "dl2-report.json"
    try:
        done = subprocess.run(
            [str(DL2), "analyze", "--json", str(report_path), *map(str, files)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
    except (subprocess.TimeoutExpired, OSError, ValueError) as err:
        return AnchorResult("fr-dl2", case.name, outcome, time_s, False, None, [], repr(err))
    scored = score_report(case, report)
    cycles = [f.get("cycle") for f in report.get("findings", []) if f.get("kind") == "deadlock"]
    cycle = next((list(c) for c in cycles if c), None)
    evidence = f"verdict {scored['verdict']}"
    if not report:
        evidence = f"no report (exit {done.returncode}): {done.stderr.strip()[:160]}"
    elif scored["missing_lines"]:
        evidence += f"; lines not named: {scored['missing_lines']}"
    return AnchorResult(
        "fr-dl2",
        case.name,
        outcome,
        time_s,
        bool(scored["positive"]),
        scored["culprit_ok"] if case.positive else None,
        scored["named_ranks"],
        evidence,
        cycle,
    )


def anchor_fr(case: Case) -> list[AnchorResult]:
    """Flight Recorder: the dumps (taken by the hook) analysed by ``torchfrtrace``, and
    by dl2 (``fr-dl2``)."""
    dump_dir = Path(tempfile.mkdtemp(prefix="dl2-bench-fr-"))
    state = dump_dir / "state"
    state.mkdir()
    trigger = state / "TRIGGER"
    env = {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": str(dump_dir / "rank_"),
        "BENCH_FR_TRIGGER": str(trigger),
        "BENCH_FR_STATE": str(state),
        "PYTHONPATH": os.pathsep.join(
            [str(FR_HOOK_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    trigger_at = anchor_cap(case)

    def finishing(alive: list[int]) -> bool:
        return all((state / f"destroy.{r}").exists() for r in alive)

    def tick(elapsed: float, codes: dict[int, int | None]) -> bool:
        alive = [r for r, c in codes.items() if c is None]
        dumped_all = all((state / f"dumped.{r}").exists() for r in alive)
        if not trigger.exists() and finishing(alive):
            # Every live rank passed destroy_process_group and wrote its dump: the job
            # is finishing.  The dump imported many modules to symbolise stacks, and
            # interpreter shutdown then took over 15 s on the loaded machine, so stop
            # here rather than wait (the run counts as exit 0 below).
            return dumped_all
        if elapsed >= trigger_at and not trigger.exists():
            trigger.touch()
        if trigger.exists():
            return dumped_all
        return False

    run = launch(
        case.path, case.world, trigger_at + FR_DUMP_GRACE_S, env, on_tick=tick, grace_after_tick=1.0
    )
    outcome = run.outcome
    stopped = [r for r, c in run.codes.items() if c is None]
    if (
        outcome == "hang"
        and not trigger.exists()
        and finishing(stopped)
        and all(c == 0 for c in run.codes.values() if c is not None)
    ):
        outcome = "exit 0"
    dumped = sorted(int(p.name.split("_")[1]) for p in dump_dir.glob("rank_*") if p.suffix == "")
    why = {}
    for rank in dumped:
        with contextlib.suppress(OSError):
            why[rank] = (state / f"dumped.{rank}").read_text()
    incomplete = len(dumped) < case.world
    raw = _torchfrtrace(dump_dir, incomplete) if dumped else "no dump"
    repaired = ""
    if dumped:
        fixed = dump_dir / "repaired"
        fr_repair(dump_dir, fixed, case.world)
        repaired = _torchfrtrace(fixed, incomplete)
    detected = "has errors" in repaired or "Not all ranks joining" in repaired
    named: set[int] = set()
    for match in re.finditer(r"Culprit rank (\d+)", repaired):
        named.add(int(match.group(1)))
    for match in re.finditer(r"missing ranks: \{([\d, ]+)\}", repaired):
        named |= {int(x) for x in match.group(1).split(",") if x.strip()}
    raw_failed = re.search(r"ANALYSER FAILED: (.*)", raw)
    lines = [
        ln.strip()
        for ln in repaired.splitlines()
        if "error msg" in ln or "Not all ranks" in ln or "missing ranks" in ln
    ]
    evidence = (
        f"dumps {why or dumped}; raw: {raw_failed.group(1)[:80] if raw_failed else 'ok'}; "
        f"repaired: {(lines[0] if lines else 'no error')[:160]}"
    )
    time_s = round(min(run.wall, trigger_at), 2) if outcome == "hang" else round(run.wall, 2)
    files = [dump_dir / f"rank_{r}" for r in dumped]
    by_dl2 = dl2_on_dumps(case, files, outcome, time_s)
    shutil.rmtree(dump_dir, ignore_errors=True)
    shutil.rmtree(run.outdir, ignore_errors=True)
    by_torch = AnchorResult(
        "fr",
        case.name,
        outcome,
        time_s,
        detected,
        (detected and named >= case.ranks) if case.positive else None,
        sorted(named),
        evidence,
    )
    return [by_torch, by_dl2]


ANCHORS: dict[str, Callable[[Case], AnchorResult | list[AnchorResult]]] = {
    "plain": anchor_plain,
    "detail": anchor_detail,
    "fr": anchor_fr,
}
#: the columns the anchors fill: ``fr`` also gives dl2's analysis of its dumps
ANCHOR_COLUMNS = ("plain", "detail", "fr", "fr-dl2")


def run_anchors(cases: list[Case], jobs: int) -> list[AnchorResult]:
    """Every anchor on every case, ``jobs`` at a time, printing a line for each."""
    budget = _RankBudget(ANCHOR_RANK_BUDGET)
    results: list[AnchorResult] = []
    lock = threading.Lock()

    def one(case: Case, anchor: str) -> None:
        with budget.take(case.world):
            try:
                got = ANCHORS[anchor](case)
            except Exception as err:  # keep the evaluation going
                got = AnchorResult(anchor, case.name, "error", None, False, None, [], repr(err))
        with lock:
            for result in got if isinstance(got, list) else [got]:
                results.append(result)
                flag = "det" if result.detected else "   "
                print(
                    f"  anchor {result.anchor:6} {case.name:45} {result.outcome:7} {flag} "
                    f"{result.evidence[:70]}",
                    flush=True,
                )

    # longest first: the 8-rank and workload runs, then by world size
    order = sorted(cases, key=lambda c: (c.suite != "workloads", -c.world))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, case, anchor) for case in order for anchor in ANCHORS]
        for future in futures:
            future.result()
    return results
