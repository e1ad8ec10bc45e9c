"""Replay: re-executing a recorded run's communication skeleton under chosen semantics.

:func:`~dl2.replay.plan.build_replay_plan` (pure) turns a recorded session into a plan;
:func:`~dl2.replay.runner.run_plan` runs it as a real gloo job of the generic worker
(:mod:`dl2.replay.worker`), with the eager-send and fused-batch emulation of
:mod:`dl2.record.emulate`, watched by the live monitor.
"""

from __future__ import annotations

from dl2.replay.plan import ReplayPlan
from dl2.replay.plan import build_replay_plan
from dl2.replay.plan import plan_from_json

__all__ = ["ReplayPlan", "build_replay_plan", "plan_from_json"]
