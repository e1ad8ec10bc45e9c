"""Running a replay plan: ``dl2 run -n W`` on the generic worker, with emulated sends.

The one step of replay with side effects.  :func:`run_plan` writes the plan into the
replay's run directory, starts ``W`` ranks of :mod:`dl2.replay.worker` with
:func:`dl2.live.launcher.launch_ranks` (the recorder injected, as for ``dl2 run``), the
eager-send and fused-batch emulation of :mod:`dl2.record.emulate` set through the
environment, and follows them with the live monitor (:func:`dl2.live.watch.watch_job`,
as ``dl2 run`` does), which analyses and proves a deadlock exactly as for a recorded job.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dl2.errors import ConfigError
from dl2.live.launcher import launch_ranks
from dl2.live.monitor import Monitor
from dl2.live.monitor import MonitorOptions
from dl2.live.monitor import Outcome
from dl2.live.watch import watch_job
from dl2.record.emulate import ENV_BUFFER_SIZE
from dl2.record.emulate import ENV_FUSED_BATCHES
from dl2.replay.plan import ReplayPlan
from dl2.report import Report

__all__ = ["PLAN_FILE", "ReplayConfig", "run_plan", "worker_script"]

#: The plan's file name inside the replay's run directory.
PLAN_FILE = "replay-plan.json"


@dataclass(frozen=True)
class ReplayConfig:
    """The send semantics a replay emulates.

    Attributes:
        buffer_size: eager sends up to this many bytes; None: gloo's rendezvous sends.
        fused_batches: each batch_isend_irecv launches as one unit (NCCL's groups).
    """

    buffer_size: int | None = None
    fused_batches: bool = False

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.buffer_size is not None:
            env[ENV_BUFFER_SIZE] = str(self.buffer_size)
        if self.fused_batches:
            env[ENV_FUSED_BATCHES] = "1"
        return env


def worker_script() -> Path:
    """The worker's file, run as the ranks' script."""
    return Path(__file__).with_name("worker.py")


def run_plan(
    plan: ReplayPlan,
    config: ReplayConfig,
    run_dir: Path,
    options: MonitorOptions,
    *,
    on_report: Callable[[Report], None] | None = None,
    notice: Callable[[str], None] | None = None,
) -> Outcome:
    """Replay ``plan`` under ``config`` into ``run_dir``; returns the monitor's outcome.

    Raises:
        ConfigError: the run directory cannot be written.
        LaunchError: the ranks cannot be started.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        plan_path = run_dir / PLAN_FILE
        plan_path.write_text(json.dumps(plan.to_json(), indent=1, sort_keys=True) + "\n")
    except OSError as err:
        raise ConfigError(f"cannot write the replay plan to {run_dir}: {err.strerror}") from None
    job = launch_ranks(
        str(worker_script()), [str(plan_path.resolve())], plan.world_size, run_dir, config.env()
    )
    return watch_job(Monitor(run_dir, job, options, on_report=on_report, notice=notice))
