"""The Bridge Callback that turns each step into one honest row of `<run dir>/metrics.jsonl` (and of the W&B run).

Per step: step time (CUDA-synchronised wall clock, max over ranks), peak memory (max over ranks), losses, the
token/image counters and vlmtrain's FLOPs summed over the data-parallel group, useful tokens/s/GPU and MFU; the
per-component times of global rank 0 (observe.timing: the first pipeline stage, the one that runs the ViT); and
Megatron Bridge's own numbers under their own names (megatron_*), computed by Bridge's code. The last rank (it holds
the loss on the last pipeline stage, and is the rank Bridge logs from) writes the file and the W&B run, and prints
the step's line (observe.step_line) in place of Bridge's MODEL_TFLOP/s.

Also per step: `samples.jsonl`, one row per data-parallel rank (written by that rank's first TP/CP rank of the
first pipeline stage, from the ids the step counters took off its batches: no communication) with the sample
indices of each of its micro-batches; `skipped_steps` (Bridge's skipped_iter: an update Megatron skipped under
train.on_nonfinite=skip); and under on_nonfinite=stop a non-finite loss or grad norm that Megatron's own checks
let through stops the run (observe.failure.NonFiniteStep): under stop_at_step_end, which turns those checks off,
this is the check.

Validation (train.eval_interval): Bridge evaluates right after a step's on_train_step_end, every eval_interval
steps and once more after the last one, and hands its averaged losses to on_eval_end. The writer holds the row of a
step that an evaluation follows and writes it there with `val_lm_loss` (Bridge's "lm loss" over the held-out
batches) and `val_s` (the evaluation's wall time), so the loss sits on the row of the step it evaluated; the
evaluation's batches pass through the same counting forward step and are dropped from the counters, so the next
step's row counts only its own.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron.bridge.training.callbacks import Callback

from vlmtrain.config import flops
from vlmtrain.config.groups import precision
from vlmtrain.config.resolve import Resolved
from vlmtrain.observe import keys, startup, timing, wandb_run
from vlmtrain.observe.run_summary import SKIP, append_jsonl, read_jsonl
from vlmtrain.observe.step_line import step_line
from vlmtrain.train.step_counters import COUNTERS

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.schema import RunConfig
    from vlmtrain.train.step_counters import StepCounters

TIMING_RANK = 0
SAMPLES_FILE = "samples.jsonl"
TIMED = (*timing.COMPONENTS, "data_host_s")


def megatron_numbers(cfg: ConfigContainer, batch_size: int, stats: tuple, step_s: float,
                     world_size: int) -> dict[str, float]:
    """What Bridge reports for this step, by Bridge's own code, over our step time: tokens/s = GBS x seq_length /
    time (padding counted, report_throughput's definition) and model TFLOP/s/GPU from flop_utils'
    num_floating_point_operations with the arguments train.py passes (`stats` = its
    resolve_global_flops_runtime_stats: padded sequence sums and ViT patches of the step)."""
    from megatron.bridge.training.utils.flop_utils import num_floating_point_operations

    seqlen_sum, seqlen_squared_sum, patches, cross_sum, cross_product_sum = stats
    flops = float(num_floating_point_operations(cfg, batch_size=batch_size, seqlen_sum=seqlen_sum,
                                                seqlen_squared_sum=seqlen_squared_sum, num_vision_patches=patches,
                                                cross_seqlen_sum=cross_sum, cross_seqlen_product_sum=cross_product_sum))
    tokens = cfg.train.global_batch_size * cfg.dataset.seq_length
    return {"megatron_flops": flops, "megatron_tokens_per_s": tokens / step_s,
            "megatron_tokens_per_s_per_gpu": tokens / step_s / world_size,
            "megatron_tflops_per_s_per_gpu": flops / step_s / world_size / 1e12}


def bridge_step_stats(context: Any) -> tuple[int, tuple]:
    """(global batch size, FLOPs sequence stats) of this step exactly as train.py resolves them after the step
    (all ranks call this: for THD-packed batches Bridge's resolver all-reduces over the data-parallel group)."""
    from megatron.bridge.training.utils.flop_utils import resolve_global_flops_runtime_stats
    from megatron.bridge.training.utils.pg_utils import get_pg_collection
    from megatron.core.num_microbatches_calculator import get_num_microbatches

    cfg = context.state.cfg
    dp = get_pg_collection(context.model).dp
    cross = hasattr(cfg.model, "_get_num_floating_point_operations_with_runtime_stats")
    stats = resolve_global_flops_runtime_stats(
        context.state, data_parallel_size=dp.size(), vp_size=cfg.model.virtual_pipeline_model_parallel_size,
        dp_group=dp, include_cross_attention_stats=cross)
    return dp.size() * cfg.train.micro_batch_size * get_num_microbatches(), stats


def step_rates(run: RunConfig, counts: dict[str, Any], fl: flops.Flops, step_s: float, gpus: int) -> dict[str, Any]:
    """One step's FLOPs, token rates and MFUs from its token counts (all ranks') and vlmtrain's FLOPs: the one
    definition of these keys, for vlmtrain's rows and the Bridge-recipe peer's (lab.bridge_recipe)."""
    return {"flops_vit": fl.vit, "flops_projector": fl.projector, "flops_decoder": fl.decoder, "flops": fl.total,
            keys.USEFUL_TOKENS_PER_S_PER_GPU: counts["nonpad_tokens"] / step_s / gpus,
            "padded_tokens_per_s_per_gpu": counts["padded_tokens"] / step_s / gpus,
            "tflops_per_s_per_gpu": fl.total / step_s / gpus / 1e12,
            keys.MFU: flops.mfu(fl.total, step_s, gpus, run.hardware.peak_bf16_tflops),
            "mfu_precision_peak": flops.mfu(fl.total, step_s, gpus, precision.peak_tflops(run)),
            "precision": precision.label(run)}


def loss_values(loss_dict: dict[str, Any] | None) -> dict[str, float]:
    """Bridge's loss dict as row keys ("lm loss" -> lm_loss), tensors as floats."""
    return {keys.row_key(k): float(v.item() if hasattr(v, "item") else v) for k, v in (loss_dict or {}).items()}


def grad_norm(context: Any) -> dict[str, float]:
    """The step's grad norm as Bridge hands it to callbacks (Megatron's, over all ranks; absent without clipping)."""
    return {} if context.grad_norm is None else {keys.GRAD_NORM: float(context.grad_norm)}


class MetricsCallback(Callback):
    """`counters` count the batches and `timer` times the components of each step (its data mark is the one the
    counters' data_wait enters); `res` (config.resolve, the run's run.json) gives the layout and grad-accum."""

    def __init__(self, run: RunConfig, res: Resolved, counters: StepCounters, timer: timing.StepTimer):
        wandb_run.check_bridge_logger(run)
        self.run, self.counters, self.timer = run, counters, timer
        self.resolved = res
        self.path = Path(run.output_dir) / "metrics.jsonl"
        self.samples_path = Path(run.output_dir) / SAMPLES_FILE
        self.t0 = 0.0
        self.wandb_run: Any = None
        self.state: Any = None  # Bridge's GlobalState, from on_train_start: the step a failure record names
        self.skipped_steps = 0
        self.train_start: float | None = None
        self.warned_data_bound = False
        self.held: dict[str, Any] | None = None  # the row of a step an evaluation follows (written in on_eval_end)
        self.eval_start = 0.0

    def _is_writer(self) -> bool:
        import torch.distributed as dist

        return dist.get_rank() == dist.get_world_size() - 1

    def on_train_start(self, context: Any) -> None:
        from vlmtrain.data import prepare
        from vlmtrain.train import after_build

        self.state = context.state
        self.train_start = time.time()
        self.skipped_samples = prepare.skipped_samples(self.run)  # bad samples the build's data scan dropped
        self.truncated = ({"truncated_samples": prepare.scan_count(self.run, "truncated_samples")}
                          if self.run.data.truncate_long_samples else {})  # opt-in only: default rows unchanged
        self.report = after_build.after_model_build(self.run, self.resolved, context)
        self.frozen_before = after_build.frozen_checksums(context.model)
        self.max_graphed = 0
        self.timer.attach(context.model, context.optimizer)
        if self._is_writer():
            self.wandb_run = wandb_run.init(self.run, context.state.cfg, self.resolved)
            wandb_run.hand_to_bridge(context.state, self.wandb_run)
        self._write_checks()

    def on_train_end(self, context: Any) -> None:
        from vlmtrain.train import after_build

        self.report.update(after_build.after_training(self.run, context, self.frozen_before, self.max_graphed))
        self._write_checks()
        self.timer.detach()
        if self._is_writer():
            # the last step's row is still held when Bridge's evaluation after training follows it
            held = [self.held] if self.held is not None else []
            wandb_run.summarize(self.wandb_run, self.report, read_jsonl(self.path) + held)

    def on_eval_start(self, context: Any) -> None:
        self.eval_start = time.perf_counter()

    def on_eval_end(self, context: Any) -> None:
        """The evaluated step's row with its validation loss (the writer, on the last pipeline stage: the rank whose
        total_loss_dict holds the losses); every rank drops the evaluation's batches from its counters."""
        self.counters.reset()
        if self.held is not None and context.total_loss_dict:
            self.held.update({keys.VAL_PREFIX + k: v for k, v in loss_values(context.total_loss_dict).items()},
                             val_s=time.perf_counter() - self.eval_start)
        self._write_held()

    def _write_held(self) -> None:
        if self.held is not None:
            row, self.held = self.held, None
            self._write(row)

    def _evaluation_follows(self, context: Any) -> bool:
        """Bridge evaluates after this step (train.py's condition, at the step number it has after the step; and
        pretrain's evaluation after the last step)."""
        state, val = context.state, context.state.cfg.validation
        done = state.train_state.step + 1
        if not state.train_state.do_valid:
            return False
        in_loop = bool(val.eval_interval) and done % val.eval_interval == 0 and \
            (val.start_eval_at_iter is None or done >= val.start_eval_at_iter)
        return in_loop or done == state.cfg.train.train_iters

    def _write_checks(self) -> None:
        if self._is_writer():
            (Path(self.run.output_dir) / "checks.json").write_text(json.dumps(self.report, indent=1))
            print("[vlmtrain] checks: " + json.dumps(self.report), flush=True)

    def on_train_step_start(self, context: Any) -> None:
        import torch

        self._write_held()  # an evaluation cut short (Bridge's exit_duration_in_mins) fires no on_eval_end
        torch.cuda.synchronize()
        self.t0 = time.perf_counter()
        self.timer.start()

    def on_train_step_end(self, context: Any) -> None:
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state

        from vlmtrain.train import after_build

        self.timer.stop()
        torch.cuda.synchronize()
        t_end = time.perf_counter()
        step_s = t_end - self.t0
        if self.run.cuda_graph.modules:
            self.max_graphed = max(self.max_graphed, after_build.graphed_layers(context.model))
        fl = flops.step_flops(self.run, self.counters.samples)
        local = [float(self.counters.totals[k]) for k in COUNTERS] + [fl.vit, fl.projector, fl.decoder]
        vec = torch.tensor(local, dtype=torch.float64, device="cuda")
        dist.all_reduce(vec, group=parallel_state.get_data_parallel_group())
        # One MAX over all ranks: peak memory, step time, and rank 0's component times (zeros elsewhere).
        times = self.timer.totals() if dist.get_rank() == TIMING_RANK else {}
        maxed = [torch.cuda.max_memory_allocated() / 2**30, step_s] + [times.get(k, 0.0) for k in TIMED]
        peak = torch.tensor(maxed, dtype=torch.float64, device="cuda")
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        batch_size, stats = bridge_step_stats(context)
        peak_gib, step_s, *timed = peak.tolist()
        self.skipped_steps += int(bool(getattr(context, "skipped_iter", False)))
        self._write_samples(context)
        # This rank's host time in vlmtrain's per-step code (counting the batches, the step timer's hooks and CUDA
        # event marks, this callback up to here): what vlmtrain adds to every step on the host.
        host_s = self.counters.host_s + self.timer.host_s + time.perf_counter() - t_end
        if not self._is_writer():
            self._stop_if_nonfinite({"step": context.state.train_state.step, **grad_norm(context)})
            self.counters.reset()
            return
        row = self._row(context, vec.tolist(), peak_gib, step_s)
        row["vlmtrain_host_s"] = host_s
        if self.train_start is not None:  # the first row: what came before the first step ended
            row.update(startup.first_row(self.train_start, time.time()))
            self.train_start = None
        self._stop_if_nonfinite(row)  # before the reset: the failure record names this step's sample ids
        self.counters.reset()
        row.update(timing.row(dict(zip(TIMED, timed, strict=True)), step_s), data_host_s=timed[-1])
        self._hint_if_data_bound(row)
        row.update(megatron_numbers(context.state.cfg, batch_size, stats, step_s, dist.get_world_size()))
        if self._evaluation_follows(context):
            self.held = row
        else:
            self._write(row)

    def _write(self, row: dict[str, Any]) -> None:
        append_jsonl(self.path, row)
        print(step_line(row), flush=True)
        wandb_run.log_row(self.wandb_run, row)

    def _hint_if_data_bound(self, row: dict[str, Any]) -> None:
        """Once per run, after the warm-up steps (their batches were prefetched): say so when the step waited on the
        data loader, since the GPU idles for it and more loader workers are the fix."""
        share = timing.data_bound(row.get("time_data_s"), row["step_s"])
        if share is None or self.warned_data_bound or row["step"] < SKIP:
            return
        self.warned_data_bound = True
        print(f"[vlmtrain] data-bound: step {row['step']} waited {row['time_data_s']:.2f} s ({share:.0%}) on the "
              f"data loader; raise data.num_workers (now {self.run.data.num_workers})", flush=True)

    def failing_step(self) -> int | None:
        """The step in flight (metrics.jsonl's numbering), for a failure record."""
        return None if self.state is None else int(self.state.train_state.step)

    def _write_samples(self, context: Any) -> None:
        """This data-parallel rank's row of samples.jsonl (one writer per DP rank: TP/CP rank 0, first stage)."""
        from megatron.core import parallel_state as ps

        ids = self.counters.sample_ids
        if not any(i is not None for mb in ids for i in mb) or ps.get_tensor_model_parallel_rank() != 0 \
                or ps.get_context_parallel_rank() != 0 or not ps.is_pipeline_first_stage(ignore_virtual=True):
            return
        append_jsonl(self.samples_path, {"step": context.state.train_state.step,
                                         "dp_rank": ps.get_data_parallel_rank(), "micro_batches": ids})

    def _stop_if_nonfinite(self, row: dict[str, Any]) -> None:
        """on_nonfinite=stop / stop_at_step_end: a loss or grad norm that is not finite ends the run here (the writer
        writes its row first), before Bridge saves any checkpoint of this step. The grad norm is the same on every
        rank (Megatron reduces it over all of them), so every rank stops on it, not only the writer."""
        import math

        bad = {k: row[k] for k in ("lm_loss", "grad_norm") if k in row and not math.isfinite(row[k])}
        if bad and self.run.train.on_nonfinite != "skip":
            append_jsonl(self.path, row)
            from vlmtrain.observe.failure import NonFiniteStep

            raise NonFiniteStep(f"non-finite {', '.join(f'{k}={v}' for k, v in bad.items())} at step {row['step']}")

    def _row(self, context: Any, vals: list[float], peak_gib: float, step_s: float) -> dict[str, Any]:
        """Counters, vlmtrain FLOPs and throughput, losses and grad norm of this step."""
        row: dict[str, Any] = {keys.STEP: context.state.train_state.step, keys.STEP_S: step_s,
                               keys.PEAK_MEM_GIB: peak_gib, "data_kind": str(self.run.data.kind),
                               "skipped_samples": self.skipped_samples, keys.SKIPPED_STEPS: self.skipped_steps,
                               **self.truncated}
        row.update({k: int(v) for k, v in zip(COUNTERS, vals[: len(COUNTERS)], strict=True)})
        fl = flops.Flops(*vals[len(COUNTERS):])
        row.update(step_rates(self.run, row, fl, step_s, self.resolved.layout.world_size))
        row.update(loss_values(context.loss_dict))
        row.update(grad_norm(context))
        return row
