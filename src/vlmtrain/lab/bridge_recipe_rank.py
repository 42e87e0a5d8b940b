"""The one torchrun rank of a run of Bridge's own recipe (vlmtrain.lab.bridge_recipe starts it): the recipe's container
through Bridge's pretrain() with the recipe's forward step, and a read-only callback writing vlmtrain's metrics.jsonl
keys (the CUDA-synchronised step time, useful tokens from vlmtrain's counters, FLOPs from vlmtrain.config.flops).

    python -m vlmtrain.lab.bridge_recipe_rank <benchmark> <run dir>     # under torchrun, as bridge_recipe starts it
"""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron.bridge.training.callbacks import Callback

from vlmtrain.lab import bridge_recipe
from vlmtrain.lab.bridge_benchmarks import BENCHMARKS, Benchmark
from vlmtrain.observe import run_summary

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.train.step_counters import StepCounters


class PeerMetrics(Callback):
    """One metrics.jsonl row per step, vlmtrain's keys: it reads the counters and the clock, and changes nothing."""

    def __init__(self, run: RunConfig, counters: StepCounters):
        self.run, self.counters, self.t0 = run, counters, 0.0
        self.path = Path(run.output_dir) / "metrics.jsonl"

    def on_train_step_start(self, context: Any) -> None:
        import torch

        torch.cuda.synchronize()
        self.t0 = time.perf_counter()

    def on_train_step_end(self, context: Any) -> None:
        import torch

        from vlmtrain.config import flops
        from vlmtrain.observe.metrics_callback import loss_values, step_rates

        torch.cuda.synchronize()
        step_s = time.perf_counter() - self.t0
        fl = flops.step_flops(self.run, self.counters.samples)
        row: dict[str, Any] = {"step": context.state.train_state.step, "step_s": step_s,
                               "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, **self.counters.totals,
                               **step_rates(self.run, self.counters.totals, fl, step_s, 1),
                               **loss_values(context.loss_dict)}
        self.counters.reset()
        run_summary.append_jsonl(self.path, row)


def main(bench: Benchmark, run_dir: Path) -> int:
    """The one torchrun rank: the recipe's container through Bridge's pretrain() and the recipe's forward step."""
    from megatron.bridge.models.qwen_vl.qwen3_vl_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    from vlmtrain.train import trainer
    from vlmtrain.train.step_counters import StepCounters

    run, res = bridge_recipe.bench_run(bench, run_dir)
    cfg = bridge_recipe.recipe_config(bench, run, res)
    trainer.use_prebuilt_dataset_helpers()  # the core wheel ships the helpers built but no Makefile
    counters = StepCounters(run, res, nullcontext)
    pretrain(cfg, counters.wrap(forward_step), callbacks=[PeerMetrics(run, counters)])
    return 0


if __name__ == "__main__":
    sys.exit(main(BENCHMARKS[sys.argv[1]], Path(sys.argv[2])))
