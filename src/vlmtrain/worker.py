"""One torchrun rank or Slurm task: load the saved run config and train with observe's step timer and metrics
callback (env vars came from the launcher)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig


def train(run: RunConfig) -> None:
    """The training entry: Bridge's pretrain() counting every batch, timing every step, writing metrics.jsonl."""
    from vlmtrain.observe.metrics_callback import MetricsCallback
    from vlmtrain.observe.timing import StepTimer
    from vlmtrain.train import trainer
    from vlmtrain.train.step_counters import StepCounters

    timer = StepTimer()
    counters = StepCounters(run, timer.data)
    trainer.train(run, counters, [MetricsCallback(run, counters, timer)])


def main(path: str) -> None:
    from vlmtrain.config.compose import load_run

    train(load_run(path))


if __name__ == "__main__":
    main(sys.argv[1])
