"""One torchrun rank or Slurm task: load the saved run config and train with observe's step timer and metrics
callback (env vars came from the launcher)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


def train(run: RunConfig, resolved: Resolved | None = None) -> None:
    """The training entry: Bridge's pretrain() counting every batch, timing every step, writing metrics.jsonl
    (`resolved`: the run's run.json values, else resolved here)."""
    from vlmtrain.observe.metrics_callback import MetricsCallback
    from vlmtrain.observe.timing import StepTimer
    from vlmtrain.train import trainer
    from vlmtrain.train.step_counters import StepCounters

    timer = StepTimer()
    counters = StepCounters(run, timer.data, resolved)
    trainer.train(run, counters, [MetricsCallback(run, counters, timer, resolved)])


def main(path: str) -> None:
    """A torchrun rank: the saved run config and, next to it, the run.json the launcher saved."""
    from pathlib import Path

    from vlmtrain.config import resolve
    from vlmtrain.config.compose import load_run

    train(load_run(path), resolve.load(Path(path).parent))


if __name__ == "__main__":
    main(sys.argv[1])
