"""``pytest --dl2``: record and monitor the process groups each test starts.

Around each test's call the plugin sets the environment ``dl2 run`` gives a job (the
bootstrap first on ``PYTHONPATH``, ``DL2_RUN_DIR`` a fresh run directory for the test),
so every Python process the test starts - ``torch.multiprocessing.spawn`` children,
``multiprocessing`` children of the spawn or forkserver start method, a ``torchrun``
subprocess and its workers - records its communication there; a child forked from the
pytest process (start method ``fork``) gets the recorder from an at-fork hook when the
test has imported ``torch.distributed``.  A thread of the pytest
process follows that directory with dl2's live monitor (:class:`dl2.live.monitor.Monitor`);
when it proves a deadlock it stops the test's ranks (only the processes whose trace
headers name them, never pytest itself), so the test's ``spawn`` or ``subprocess`` call
returns, and the test fails with dl2's diagnosis instead of hanging.  The report is
written to ``report.json`` in the run directory (and ``report.html`` where dl2 has an
``html`` renderer) and its path is printed in the failure.

A test that starts no process group pays for the environment variables and a thread
that lists an empty directory; its run directory is removed afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Generator
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

#: the options' names and defaults
DEFAULT_DIR = "dl2-runs"
DEFAULT_HANG_TIMEOUT = 60.0
#: seconds the stopped ranks get after SIGTERM before SIGKILL
GRACE_S = 2.0
#: seconds between two looks at a test's run directory (dl2 run's default poll)
POLL_S = 0.2
_KEY = pytest.StashKey["_Watch"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dl2", "dl2: communication deadlocks of distributed tests")
    group.addoption(
        "--dl2",
        action="store_true",
        default=False,
        help="record the process groups each test starts; fail a deadlocked test with "
        "dl2's diagnosis instead of hanging",
    )
    group.addoption(
        "--dl2-dir",
        default=DEFAULT_DIR,
        metavar="DIR",
        help=f"where each test's run directory goes (default {DEFAULT_DIR}/pytest-<time>)",
    )
    group.addoption(
        "--dl2-hang-timeout",
        type=float,
        default=DEFAULT_HANG_TIMEOUT,
        metavar="S",
        help="stop a test's ranks after S seconds in which all sat in communication with "
        f"no progress and no deadlock could be proven (default {DEFAULT_HANG_TIMEOUT:g})",
    )


def pytest_configure(config: pytest.Config) -> None:
    global _fork_hook
    if config.getoption("dl2"):
        config.pluginmanager.register(_Dl2Plugin(config), "dl2-live")
        if not _fork_hook and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook = True


#: the run directory of the test being called, for the children it forks
_fork_run_dir: str | None = None
_fork_hook = False


def _after_fork_in_child() -> None:
    """A child forked from the pytest process during a test (``multiprocessing``'s
    ``fork`` start method) starts no interpreter, so the bootstrap never runs in it:
    install the recorder here, if the test imported torch.distributed already."""
    run_dir = _fork_run_dir
    if run_dir is None or "torch.distributed" not in sys.modules:
        return
    try:
        from dl2.record import install

        install(run_dir)
    except Exception:  # never break the test's child
        pass


@dataclass
class _Verdict:
    """What the monitor concluded for one test."""

    reason: str  # "deadlock" or "hang-timeout"
    text: str  # the console report
    paths: tuple[Path, ...]  # report files written


class _TestJob:
    """The monitor's view of a test's job: it ends when the test call returns; stopping
    it signals the recorded ranks' processes (by PID), never pytest's own."""

    ranked = False

    def __init__(self) -> None:
        self.procs: dict[int, Any] = {}
        self.done = threading.Event()
        self.stopped_by_dl2 = False

    def poll(self) -> dict[int, int | None]:
        return {}

    def finished(self) -> bool:
        return self.done.is_set()

    def exit_code(self) -> int:
        return 0

    def stop(self, extra_pids: Iterable[int] = (), grace: float = GRACE_S) -> None:
        self.stopped_by_dl2 = True
        kill_ranks(extra_pids, grace)


def kill_ranks(pids: Iterable[int], grace: float = GRACE_S) -> None:
    """SIGTERM these processes, then SIGKILL those still alive after ``grace`` seconds;
    the pytest process and its parents are never among them."""
    from dl2.live.launcher import process_alive

    own = {os.getpid(), os.getppid()}
    targets = [p for p in set(pids) if p > 1 and p not in own]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in targets:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(process_alive(p) for p in targets):
            time.sleep(0.05)
        if not any(process_alive(p) for p in targets):
            return


class _Watch:
    """One test's run directory and the thread that monitors it."""

    def __init__(self, run_dir: Path, hang_timeout: float) -> None:
        self.run_dir = run_dir
        self.hang_timeout = hang_timeout
        self.job = _TestJob()
        self.notes: list[str] = []
        self.monitor: Any = None  # built when the first trace appears
        self.verdict: _Verdict | None = None
        self.error: str | None = None
        self.thread = threading.Thread(target=self._follow, name="dl2-monitor", daemon=True)

    def _follow(self) -> None:
        from dl2.trace.format import TRACE_SUFFIX

        try:
            while not self.job.finished():
                if self.monitor is None:
                    if not any(self.run_dir.glob("*" + TRACE_SUFFIX)):
                        time.sleep(POLL_S)
                        continue
                    self.monitor = self._monitor()
                outcome = self.monitor.step()
                if outcome is not None and outcome.reason in ("deadlock", "hang-timeout"):
                    self.verdict = _conclude(self.run_dir, outcome)
                    return
                if outcome is not None:
                    return
                time.sleep(POLL_S)
        except Exception as err:  # dl2 must never break the test run
            self.error = f"dl2 monitor stopped: {err!r}"

    def _monitor(self) -> Any:
        """dl2's live monitor on the run directory (imported only for tests that record)."""
        from dl2.live.monitor import Monitor
        from dl2.live.monitor import MonitorOptions

        options = MonitorOptions(
            poll_interval=POLL_S, hang_timeout=self.hang_timeout, suspect_after=self.hang_timeout
        )
        return Monitor(self.run_dir, self.job, options, notice=self.notes.append)  # type: ignore[arg-type]

    def finish(self) -> None:
        """The test call returned: stop following, end the ranks it left behind."""
        self.job.done.set()
        self.thread.join(timeout=30)
        if self.monitor is None:
            return
        left = [p for p in self.monitor.tailer.pids().values() if _alive(p)]
        if left:
            kill_ranks(left)
            self.notes.append(f"dl2 ended {len(left)} rank process(es) the test left running")


def _alive(pid: int) -> bool:
    from dl2.live.launcher import process_alive

    return pid != os.getpid() and process_alive(pid)


def _conclude(run_dir: Path, outcome: Any) -> _Verdict:
    """The console text of a stopped test's report; the report files written."""
    from dl2.errors import Dl2Error
    from dl2.render import RENDERERS
    from dl2.render import get_renderer
    from dl2.render import write_report

    report = outcome.report
    if report is None:
        return _Verdict(outcome.reason, f"dl2 stopped the test ({outcome.reason})", ())
    paths = []
    for name in ("json", "html"):
        if name not in RENDERERS:
            continue
        path = run_dir / f"report.{name}"
        try:
            write_report(get_renderer(name), report, str(path))
            paths.append(path)
        except Dl2Error:
            pass
    text = get_renderer("text", color=False).render(report)
    return _Verdict(outcome.reason, text, tuple(paths))


def _label(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.split("::", 1)[-1])[:80] or "test"


class _Dl2Plugin:
    """The plugin's hooks, registered when ``--dl2`` is given."""

    def __init__(self, config: pytest.Config) -> None:
        # Import now what the monitor thread and the at-fork hook use: a child forked
        # while another thread imports a module waits forever on that module's lock.
        import dl2.live.launcher
        import dl2.live.monitor
        import dl2.record.install
        import dl2.render
        import dl2.trace.format  # noqa: F401

        self.root = Path(config.getoption("dl2_dir")).resolve()
        self.root_existed = self.root.exists()
        self.base = self.root / time.strftime("pytest-%Y%m%d-%H%M%S")
        self.hang_timeout = float(config.getoption("dl2_hang_timeout"))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        from dl2.live.launcher import new_run_dir
        from dl2.live.launcher import recorder_env

        run_dir = new_run_dir(_label(item.nodeid), base=self.base)
        saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "DL2_RUN_DIR")}
        env = recorder_env(run_dir)
        os.environ["PYTHONPATH"] = env["PYTHONPATH"]
        os.environ["DL2_RUN_DIR"] = env["DL2_RUN_DIR"]
        watch = _Watch(run_dir, self.hang_timeout)
        item.stash[_KEY] = watch
        watch.thread.start()
        global _fork_run_dir
        _fork_run_dir = env["DL2_RUN_DIR"]
        try:
            yield
        finally:
            _fork_run_dir = None
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            watch.finish()
            if not any(run_dir.iterdir()):
                shutil.rmtree(run_dir, ignore_errors=True)
                # only directories this session made and no test left a run in
                for made in (self.base, *(() if self.root_existed else (self.root,))):
                    try:
                        made.rmdir()
                    except OSError:
                        break

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        outcome = yield
        if call.when != "call":
            return
        watch = item.stash.get(_KEY, None)
        if watch is None:
            return
        report: pytest.TestReport = outcome.get_result()
        notes = [*watch.notes, *([watch.error] if watch.error is not None else [])]
        if notes:  # shown with the test's output: a stop, a monitor fault, ranks ended
            report.sections.append(("dl2", "\n".join(notes)))
        verdict = watch.verdict
        if verdict is None:
            return
        where = "\n".join(f"dl2 report: {p}" for p in verdict.paths)
        if verdict.reason == "deadlock":
            why = "dl2: deadlock proven while the test ran; dl2 stopped its ranks"
        else:
            why = (
                f"dl2: the test's ranks sat in communication for {self.hang_timeout:g} s "
                "without progress (--dl2-hang-timeout); dl2 stopped them"
            )
        lines = [
            why,
            "",
            verdict.text.rstrip(),
            "",
            where or f"dl2 run directory: {watch.run_dir}",
            f"re-analyse: dl2 analyze {watch.run_dir}",
        ]
        if call.excinfo is not None:
            lines += ["", f"the test then raised: {call.excinfo.exconly()[:500]}"]
        report.outcome = "failed"
        report.longrepr = "\n".join(lines)
