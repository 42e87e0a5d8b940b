"""The names of the metrics vlmtrain logs (metrics.jsonl rows, the W&B run's history and summary) that later stages
read by name: the metrics callback writes them through these constants and the W&B views chart them through the same
ones, so a metric renamed here is renamed in the logs and the views together (and a recorded run with the old name
fails the views' test); the run summary and the report still name some of them as literals.

Bridge logs its own numbers into the same W&B run under Bridge's names (`BRIDGE_*`: its training_log and Megatron
Core's MoE tracker, at the same iteration as vlmtrain's row of that step).
"""

from __future__ import annotations

STEP = "step"
STEP_S = "step_s"
"""Seconds per step: CUDA-synchronised wall clock, max over ranks."""
PEAK_MEM_GIB = "peak_mem_gib"
"""torch.cuda.max_memory_allocated() in GiB, max over ranks."""
USEFUL_TOKENS_PER_S_PER_GPU = "useful_tokens_per_s_per_gpu"
"""Non-padding tokens per second per GPU: the number sweeps are ranked by."""
MFU = "mfu"
"""vlmtrain's freeze-aware model FLOPs on the useful tokens over the hardware's dense BF16 peak."""
GRAD_NORM = "grad_norm"
SKIPPED_STEPS = "skipped_steps"
"""Updates Megatron skipped so far (train.on_nonfinite=skip)."""
MEMORY_ESTIMATE_GIB = "memory_estimate_gib"
"""The memory estimate's allocator peak for the run (check.memory: comparable with peak_mem_gib), W&B summary."""

REPORT_PREFIX = "report/"
"""W&B summary keys of a finished run's figures as `vlmtrain report` computes them (report/useful_tokens_per_s_per_gpu:
after warm-up). Their own names: wandb rewrites a plain key's summary with the last history row when it commits that
row, which happens only at finish, after the train-end summary."""

BRIDGE_LM_LOSS = "lm loss"
"""Bridge's loss-dict key of the language-model loss (its W&B key too)."""
BRIDGE_LOAD_BALANCING_LOSS = "load_balancing_loss"
"""Megatron Core's MoE auxiliary load-balancing loss, as Bridge's training_log tracks and logs it."""
VAL_PREFIX = "val_"
"""A validation loss is its training loss's row key with this prefix."""


def row_key(bridge_key: str) -> str:
    """A Bridge loss-dict key as a metrics.jsonl key ("lm loss" -> lm_loss)."""
    return bridge_key.replace(" ", "_")


LM_LOSS = row_key(BRIDGE_LM_LOSS)
VAL_LM_LOSS = VAL_PREFIX + LM_LOSS


def report_key(key: str) -> str:
    """The W&B summary key of a run's report figure for a metrics.jsonl key."""
    return REPORT_PREFIX + key


def time_key(component: str) -> str:
    """Seconds of a step spent in one component (observe.timing: vision, projector, decoder, ..., other)."""
    return f"time_{component}_s"


def tower_mfu_key(tower: str) -> str:
    """A tower's MFU over its own timed span (observe.run_summary.tower_mfu: vit, projector, decoder)."""
    return f"mfu_{tower}"
