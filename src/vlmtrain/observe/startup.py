"""Where a run's time goes before its first step ends, in its first metrics row: the launcher (from flow.main:
preflight, the data scan, torchrun starting the rank), the rank's setup (its imports and Bridge's setup: model,
optimizer, data loaders) and the first step (first batches, compilation, autotuning). Short benchmark runs and tuning
trials spend much of their wall time outside their timed steps, and the step rows alone do not say where."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

import psutil

LAUNCH_ENV = "VLMTRAIN_LAUNCH_UNIX"
"""The time flow.main began (time.time()), handed to the ranks in their environment."""
KEYS = ("startup_launcher_s", "startup_rank_setup_s", "startup_first_step_s")


def mark_launch() -> float:
    """Called by flow.main as it begins: the ranks read the time back in first_row; flow.main keeps it too."""
    now = time.time()
    os.environ[LAUNCH_ENV] = repr(now)
    return now


def first_row(train_start: float, now: float, env: Mapping[str, str] = os.environ) -> dict[str, float]:
    """The three spans, from this rank's process start; a rank that is the launcher's own process (a Slurm task runs
    flow.main and trains in one process) has no launcher span of its own, so it counts from the launch."""
    rank_start = psutil.Process().create_time()
    launch = float(env.get(LAUNCH_ENV, rank_start))
    setup_from = max(rank_start, launch)
    return {"startup_launcher_s": max(0.0, rank_start - launch), "startup_rank_setup_s": train_start - setup_from,
            "startup_first_step_s": now - train_start}
