"""`make browser-check`: every benchmark case's HTML report, loaded in a real browser.

Each case of ``benchmarks/cases`` is run under ``dl2 run`` by the evaluation's own
runner (:func:`benchmarks.evaluation.dl2_runs.run_dl2`: hard timeouts, leftover ranks
killed), which leaves ``report.html`` in the case's run directory; a run directory
that exists is reused (``--fresh`` runs every case again; ``--rerender`` draws the
pages of the recorded runs again with ``dl2 analyze --html``).  Each page is
then opened in headless Chromium (Debian's ``/usr/bin/chromium``, driven through the
DevTools protocol by playwright) from ``file://``; the check fails on any console error,
uncaught script error, request that leaves the file (the page must be self-contained),
page over 2 MB, or case without a page.  Full-page screenshots go to
``benchmarks/results/html/<case>.png`` and a summary to ``.../summary.json``.

    python -m benchmarks.html_check [--jobs N] [--fresh] [--filter TEXT ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks._harness import CASES_DIR
from benchmarks._harness import DL2
from benchmarks._harness import Case
from benchmarks._harness import discover
from benchmarks.evaluation.dl2_runs import run_dl2

OUT = Path(__file__).resolve().parent / "results" / "html"
CHROMIUM = "/usr/bin/chromium"
MAX_BYTES = 2 * 1024 * 1024
PAGE_TIMEOUT_MS = 30_000
ANALYZE_TIMEOUT_S = 120


def _page_of(case: Case, workdir: Path, fresh: bool, rerender: bool) -> Path:
    run_dir = workdir / f"run-{case.name}"
    page = run_dir / "report.html"
    if fresh or not run_dir.exists():
        shutil.rmtree(run_dir, ignore_errors=True)  # dl2 run refuses a used run directory
        run_dl2(case, workdir)
        print(f"  ran {case.name}: {'report.html' if page.exists() else 'NO report.html'}")
    elif rerender:
        # the recorded run, analysed again post mortem (after a change to the page)
        subprocess.run(
            [str(DL2), "analyze", str(run_dir), "--html", str(page)],
            stdout=subprocess.DEVNULL,
            timeout=ANALYZE_TIMEOUT_S,
            check=False,
        )
    return page


def _load_all(pages: list[tuple[Case, Path]]) -> list[dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    results = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for case, path in pages:
                results.append(_load_one(browser, case, path))
        finally:
            browser.close()
    return results


def _load_one(browser: Any, case: Case, path: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"case": case.name, "bytes": None, "errors": []}
    if not path.exists():
        result["errors"].append("no report.html")
        return result
    size = path.stat().st_size
    result["bytes"] = size
    if size > MAX_BYTES:
        result["errors"].append(f"{size} bytes, over 2 MB")
    errors: list[str] = result["errors"]
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"script: {e}"))

    def request(req: Any) -> None:
        if not req.url.startswith(("file://", "data:")):
            errors.append(f"network request: {req.url}")

    page.on("request", request)
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    try:
        page.goto(path.resolve().as_uri(), wait_until="load", timeout=PAGE_TIMEOUT_MS)
        result["verdict"] = page.inner_text("#verdict")
        result["nodes"] = page.locator("svg.wfg g.node").count()
        result["cycle_edges"] = page.locator("svg.wfg g.edge.cycle").count()
        page.screenshot(path=str(OUT / f"{case.name}.png"), full_page=True)
        # a node's ranks unfold when it is clicked (its <details> below the graph)
        links = page.locator("svg.wfg a.nlink")
        if links.count():
            links.last.click()
            target = page.locator("details.members").last
            result["opens_on_click"] = target.evaluate("d => d.open")
            if not result["opens_on_click"]:
                errors.append("clicking a node did not unfold its ranks")
    except Exception as err:
        errors.append(f"load: {err}")
    finally:
        page.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.html_check")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--fresh", action="store_true", help="run every case again")
    parser.add_argument(
        "--rerender",
        action="store_true",
        help="reuse the recorded runs but draw their pages again (dl2 analyze --html)",
    )
    parser.add_argument("--filter", nargs="*", default=[], help="only cases whose name has one")
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"browser check: {CHROMIUM} is missing (apt-get install chromium)", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    workdir = OUT / "runs"
    workdir.mkdir(exist_ok=True)
    cases = [
        c
        for c in discover((CASES_DIR,))
        if not args.filter or any(f in c.name for f in args.filter)
    ]
    start = time.monotonic()
    print(f"browser check: {len(cases)} cases of {CASES_DIR}, run directories in {workdir}")
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        pages = list(
            pool.map(lambda c: (c, _page_of(c, workdir, args.fresh, args.rerender)), cases)
        )
    results = _load_all(pages)
    failed = [r for r in results if r["errors"]]
    sizes = sorted((r for r in results if r["bytes"]), key=lambda r: -r["bytes"])
    summary = {
        "cases": len(cases),
        "loaded": sum(
            1
            for r in results
            if r["bytes"] is not None and not any(e.startswith("load:") for e in r["errors"])
        ),
        "failed": len(failed),
        "console_errors": sum(
            1 for r in results for e in r["errors"] if e.startswith(("console", "script"))
        ),
        "largest": [(r["case"], r["bytes"]) for r in sizes[:3]],
        "seconds": round(time.monotonic() - start, 1),
        "results": results,
    }
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2))
    for r in failed:
        print(f"  FAIL {r['case']}: {'; '.join(r['errors'])}")
    largest = ", ".join(f"{name} {size / 1024:.1f} KiB" for name, size in summary["largest"])
    print(
        f"browser check: {summary['loaded']}/{len(cases)} pages loaded in Chromium, "
        f"{summary['console_errors']} console errors, {len(failed)} failed; largest: {largest}; "
        f"screenshots in {OUT}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
