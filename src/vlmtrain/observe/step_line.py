"""The per-step line a user reads while training, printed by the metrics callback's writer rank from the step's
metrics.jsonl row: the figures vlmtrain stands behind (useful = non-padding tokens; MFU from vlmtrain's freeze-aware
FLOPs over the hardware's dense BF16 peak), in place of Bridge's MODEL_TFLOP/s (bridge_patches.step_time).
"""

from __future__ import annotations

from typing import Any


def padding_share(row: dict[str, Any]) -> float:
    """Share of the step's processed token slots that were padding (0 when nothing was counted)."""
    padded = row.get("padded_tokens") or 0
    return 1.0 - row.get("nonpad_tokens", 0) / padded if padded else 0.0


def step_line(row: dict[str, Any]) -> str:
    """`[vlmtrain] step N | lm_loss L | step_s S | useful_tokens_per_s_per_gpu T | mfu M% | padding P%` from one row
    (keys as in metrics.jsonl; lm_loss left out when the row has none), `| val_lm_loss V` after an evaluation."""
    parts = [f"[vlmtrain] step {row['step']}"]
    if "lm_loss" in row:
        parts.append(f"lm_loss {row['lm_loss']:.4f}")
    parts += [f"step_s {row['step_s']:.3f}", f"useful_tokens_per_s_per_gpu {row['useful_tokens_per_s_per_gpu']:.0f}",
              f"mfu {100 * row['mfu']:.2f}%", f"padding {100 * padding_share(row):.1f}%"]
    if "val_lm_loss" in row:  # an evaluation followed this step (train.eval_interval)
        parts.append(f"val_lm_loss {row['val_lm_loss']:.4f}")
    return " | ".join(parts)
