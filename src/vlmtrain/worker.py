"""One torchrun rank or Slurm task: load the saved run config and train with observe's step timer and metrics
callback (env vars came from the launcher). A non-finite loss/gradient or an out-of-memory error ends the rank with
its record and one paragraph in the log (vlmtrain.observe.failure) and exit status 4 or 5."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.observe.metrics_callback import MetricsCallback


def train(run: RunConfig, res: Resolved) -> None:
    """The training entry: Bridge's pretrain() counting every batch, timing every step, writing metrics.jsonl
    (`res`: the run's run.json values, as the launcher resolved them)."""
    from vlmtrain.observe.metrics_callback import MetricsCallback
    from vlmtrain.observe.timing import StepTimer
    from vlmtrain.train import trainer
    from vlmtrain.train.step_counters import StepCounters

    timer = StepTimer()
    counters = StepCounters(run, res, timer.data)
    callback = MetricsCallback(run, res, counters, timer)
    try:
        trainer.train(run, res, counters, [callback])
    except BaseException as e:
        stop_with_record(run, e, callback)
        raise


def stop_with_record(run: RunConfig, error: BaseException, callback: MetricsCallback) -> None:
    """For a non-finite or OOM `error`: write this rank's record, print its paragraph and exit with its status;
    any other error returns (the caller re-raises it)."""
    import os

    from vlmtrain.observe import failure

    rec = failure.record(run, callback.resolved, error, rank=int(os.environ.get("RANK", "0")),
                         step=callback.failing_step(), micro_batches=callback.counters.sample_ids,
                         component=callback.timer.timeline.current)
    if rec is None:
        return
    print(failure.message(rec), file=sys.stderr, flush=True)
    raise SystemExit(failure.EXIT[rec["kind"]]) from error


def main(path: str) -> None:
    """A torchrun rank: train the saved run."""
    from vlmtrain.launch import local

    train(*local.loaded(path))


if __name__ == "__main__":
    main(sys.argv[1])
