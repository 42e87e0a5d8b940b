"""train section: batch sizes, sequence length, schedule, checkpoints, logging cadence.

| field              | Bridge field(s)                                      |
|--------------------|------------------------------------------------------|
| micro_batch_size   | train.micro_batch_size                               |
| global_batch_size  | train.global_batch_size (multiple of MBS x DP; null: settled, below) |
| seq_length         | model.seq_length, dataset.seq_length (model / data)  |
| iterations         | train.train_iters, scheduler.lr_decay_iters          |
| lr / min_lr        | optimizer.lr / optimizer.min_lr (cosine, warmup)     |
| save_interval      | checkpoint.save, .load (checkpoint_dir), .save_interval |
| profile_step       | profiling (PyTorch profiler), logger.tensorboard_dir  |
| profile_stacks     | profiling.pytorch_profiler_collect_callstack          |
| on_nonfinite       | rerun_state_machine.check_for_nan_in_loss, ddp.check_for_nan_in_grad |
| eval_interval      | validation.eval_interval (null: validation.eval_iters=0, no evaluation) |
| eval_iters         | validation.eval_iters                                 |

on_nonfinite: `stop` (default) keeps Megatron's checks on: a NaN/Inf loss (checked per micro-batch) or local
gradient (checked per bucket before the data-parallel reduce) raises, and the worker stops the run with a record
(vlmtrain.observe.failure). Each of those checks is a host sync (two per micro-batch, two per gradient bucket).
`stop_at_step_end` turns them off and checks the step's loss and grad norm, which reach the host at the step's end
anyway, in the metrics callback: the same stop and record, before any checkpoint of that step is written, one step's
update later (the NaN update is never saved) and without naming the bucket. `skip` turns those fatal checks off and
gives the optimizer a constant loss scale of 1.0 (the precision group writes it: Megatron's ConstantGradScaler), so
Megatron's optimizer finds the Inf/NaN in the reduced gradients and skips that step's update (Bridge's skipped_iter,
counted in metrics.jsonl `skipped_steps`); it costs one host sync per step (the found-inf flag).

eval_interval / eval_iters: Bridge's own evaluation in its training loop (training/train.py, eval.py): every
eval_interval steps, and once more after the last step, eval_iters batches of the held-out samples (data.validation
or data.validation_fraction) in forward only, each batch validation.eval_global_batch_size samples (default
train.global_batch_size; with packing, rows), its loss averaged over their loss tokens. The metrics callback puts
it on that step's metrics.jsonl row as `val_lm_loss`.

global_batch_size: null (the default) is settled where the run is placed (vlmtrain.check.defaults): 8 samples per
step, raised to the smallest multiple of micro_batch_size x DP at or above it, so every data-parallel rank gets at
least one micro-batch; a value set is kept (and refused by preflight when MBS x DP does not divide it). A run
resolved without placement (a library caller) reads it as 8 (`global_batch_size()`).

Any other Bridge field: `+bridge.<section>.<field>=<value>` (applied through Bridge's own override parser,
which rejects unknown fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

OWNS = frozenset(
    {
        "train.micro_batch_size",
        "train.global_batch_size",
        "train.train_iters",
        "train.exit_signal_handler",
        "optimizer.lr",
        "optimizer.min_lr",
        "scheduler.lr_warmup_iters",
        "scheduler.lr_decay_iters",
        "rng.seed",
        "checkpoint.save",
        "checkpoint.load",
        "checkpoint.save_interval",
        "logger.log_interval",
        "profiling",
        "logger.tensorboard_dir",
        "rerun_state_machine.check_for_nan_in_loss",
        "ddp.check_for_nan_in_grad",
        "validation.eval_interval",
        "validation.eval_iters",
    }
)


class OnNonfinite(StrEnum):
    stop = "stop"
    stop_at_step_end = "stop_at_step_end"
    skip = "skip"


@dataclass
class TrainConfig:
    micro_batch_size: int = 1
    """Samples per GPU per micro-step. VLMs are MBS-sensitive: sweep it."""
    global_batch_size: int | None = None
    """Samples per optimizer step (packed: rows). null: settled from the world where the run is placed (the module
    docstring)."""
    seq_length: int = 4096
    iterations: int = 20
    lr: float = 1.0e-4
    min_lr: float = 1.0e-5
    warmup_iters: int = 2
    seed: int = 1234
    log_interval: int = 1
    save_interval: int | None = None
    """Checkpoint every N steps into checkpoint_dir; a relaunch with an existing checkpoint resumes. null = never."""
    checkpoint_dir: str | None = None
    """null = checkpoints/<the command's overrides>, so relaunching the same command resumes the same run."""
    profile_step: int | None = None
    """Run Bridge's PyTorch profiler on this iteration (rank 0; CUDA kernels, copies and the host's op and launch
    events): the trace lands in <run dir>/torch_profile/ and `vlmtrain profile <run dir>` says where that step's GPU
    and idle time went. null = no profiler."""
    profile_stacks: bool = False
    """Also record every op's Python call stack (kernel and idle time by the model code that launched it). Unwinding
    a stack per op stretches the host side of the profiled step, so its idle gaps are partly the profiler's own."""
    on_nonfinite: OnNonfinite = OnNonfinite.stop
    """stop: a NaN/Inf loss or gradient stops the run at once, naming the step, its samples and the last good
    checkpoint (<run dir>/failure-rank<N>.json). stop_at_step_end: the same stop, from the step's loss and grad norm
    at its end (no host sync per micro-batch and bucket). skip: Megatron skips that step's update and the run goes on
    (skipped_steps in metrics.jsonl)."""
    eval_interval: int | None = None
    """Evaluate the held-out samples (data.validation or data.validation_fraction) every N steps, and after the
    last step: `val_lm_loss` in metrics.jsonl, W&B and the report. null = no validation."""
    eval_iters: int = 1
    """Batches per evaluation, each of validation.eval_global_batch_size samples (default
    train.global_batch_size)."""


UNSET_GLOBAL_BATCH = 8
"""Samples per step where train.global_batch_size is unset: what the defaults start from (check.defaults raises it
to one micro-batch per data-parallel rank), and what a run resolved without placement reads."""
UNSET_WHY = "train.global_batch_size unset"
"""How the settled value's reason starts (Resolved.auto), which the plan's batch line repeats."""


def global_batch_size(run: RunConfig) -> int:
    """train.global_batch_size, or UNSET_GLOBAL_BATCH where it is unset and the run was not placed."""
    gbs = run.train.global_batch_size
    return UNSET_GLOBAL_BATCH if gbs is None else gbs


def eval_global_batch_size(run: RunConfig) -> int:
    """Samples (packed: rows) per evaluation batch: Bridge's validation.eval_global_batch_size, defaulting to
    train.global_batch_size as Bridge's finalization does."""
    from vlmtrain.config.world import bridge_section

    return int(bridge_section(run, "validation").get("eval_global_batch_size") or global_batch_size(run))


def apply(run: RunConfig, res: Resolved, cfg: ConfigContainer) -> None:
    t = run.train
    cfg.train.micro_batch_size = t.micro_batch_size
    cfg.train.global_batch_size = global_batch_size(run)
    cfg.train.train_iters = t.iterations
    cfg.train.exit_signal_handler = True  # SIGTERM (Slurm preemption/timeout) -> checkpoint, then exit
    cfg.optimizer.lr = t.lr
    cfg.optimizer.min_lr = t.min_lr
    cfg.scheduler.lr_warmup_iters = t.warmup_iters
    cfg.scheduler.lr_decay_iters = t.iterations
    cfg.rng.seed = t.seed
    ckpt = t.checkpoint_dir if t.save_interval else None  # its default: config.compose.to_run
    cfg.checkpoint.save = ckpt
    cfg.checkpoint.load = ckpt
    cfg.checkpoint.save_interval = t.save_interval
    cfg.logger.log_interval = t.log_interval
    cfg.validation.eval_interval = t.eval_interval
    cfg.validation.eval_iters = t.eval_iters if t.eval_interval else 0  # 0: Bridge builds no validation loader
    # stop_at_step_end: the metrics callback checks; skip: the optimizer's constant loss scale finds them (precision)
    megatron_checks = t.on_nonfinite == OnNonfinite.stop
    cfg.rerun_state_machine.check_for_nan_in_loss = megatron_checks
    cfg.ddp.check_for_nan_in_grad = megatron_checks
    cfg.profiling, cfg.logger.tensorboard_dir = None, None
    if t.profile_step is not None:
        from megatron.bridge.training.config import ProfilingConfig

        # Bridge writes the trace to <tensorboard_dir>/../torch_profile (and TensorBoard scalars to the dir)
        cfg.logger.tensorboard_dir = f"{run.output_dir}/tensorboard"
        cfg.profiling = ProfilingConfig(use_pytorch_profiler=True, profile_step_start=t.profile_step,
                                        profile_step_end=t.profile_step + 1, profile_ranks=[0],
                                        pytorch_profiler_collect_callstack=t.profile_stacks)
