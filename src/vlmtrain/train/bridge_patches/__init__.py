"""Drop-in replacements for eight Bridge / Megatron / TE hot spots that profiles found (the 2 x H200 sweep's best
case's, results/profile_h200x2.jsonl; vit_host_grid, vit_attention_pad, wgrad_fusion and expert_wgrad those of
Qwen3-VL-30B-A3B's shapes on one H200, results/profile_h200.jsonl; mask_grid_only the loader's,
results/collate_cpu.jsonl): the same results, meant to be
faster.
The kernels group decides which (`replacements`); `install()` puts them in place once per training process, before
Bridge builds the model.

One module per replacement (or per kind): rope_te, vit_host (vit_positions, pin_visual_inputs, vit_host_grid),
mask_grid_only, vit_attention_pad, vit_config (vit_quantized), wgrad (wgrad_fusion, expert_wgrad); each says what
it replaces and why. `always`, `step_time` and `fsdp_hf_load` hold what every training process gets (redaction,
sample ids, no Bridge Step Time line, Bridge's HF load into Megatron-FSDP mended); `replace` the one
install/uninstall bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vlmtrain.config.groups import kernels, precision
from vlmtrain.train.bridge_patches.always import install_redaction, install_sample_ids
from vlmtrain.train.bridge_patches.fsdp_hf_load import install_fsdp_hf_load
from vlmtrain.train.bridge_patches.mask_grid_only import grid_only, install_mask_grid_only
from vlmtrain.train.bridge_patches.replace import installed, uninstall
from vlmtrain.train.bridge_patches.rope_te import _te_rope, install_rope_te
from vlmtrain.train.bridge_patches.step_time import install_quiet_step_time
from vlmtrain.train.bridge_patches.vit_attention_pad import install_vit_attention_pad, pad_head_dim, padded_heads
from vlmtrain.train.bridge_patches.vit_config import install_vit_quantized
from vlmtrain.train.bridge_patches.vit_host import (
    install_pin_visual_inputs,
    install_vit_host_grid,
    install_vit_positions,
    packed_seq_params,
    pin_memory,
    pos_embed_interpolate,
    rot_pos_emb,
)
from vlmtrain.train.bridge_patches.wgrad import TEWgradAccumulation, install_expert_wgrad, install_wgrad_fusion

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig

__all__ = ["INSTALL", "SAME_BATCHES", "TEWgradAccumulation", "_te_rope", "grid_only", "install", "install_always",
           "install_expert_wgrad", "install_fsdp_hf_load", "install_mask_grid_only", "install_pin_visual_inputs",
           "install_quiet_step_time", "install_redaction", "install_rope_te", "install_sample_ids",
           "install_vit_attention_pad", "install_vit_host_grid", "install_vit_positions", "install_vit_quantized",
           "install_wgrad_fusion", "installed", "pad_head_dim", "packed_seq_params", "padded_heads", "pin_memory",
           "pos_embed_interpolate", "rot_pos_emb", "uninstall"]


def install_always() -> None:
    """What every training process gets, whatever the groups say: redaction, sample ids, no Bridge Step Time
    line (vlmtrain's metrics callback prints its own), and Megatron-FSDP runs that start from HF weights."""
    install_redaction()
    install_sample_ids()
    install_quiet_step_time()
    install_fsdp_hf_load()


SAME_BATCHES = frozenset({"mask_grid_only"})
"""Replacements in the loader alone: every batch a rank receives is the same tensor for tensor (their tests say so),
so a preset with them trains what a measured case without them trained."""

INSTALL: dict[str, Callable[[RunConfig], None]] = {
    "rope_te": lambda run: install_rope_te(), "vit_positions": lambda run: install_vit_positions(),
    "pin_visual_inputs": lambda run: install_pin_visual_inputs(), "vit_host_grid": lambda run: install_vit_host_grid(),
    "vit_quantized": lambda run: install_vit_quantized(), "mask_grid_only": lambda run: install_mask_grid_only(),
    "vit_attention_pad": lambda run: install_vit_attention_pad(run.kernels.vit_attention_head_dim),
    "wgrad_fusion": lambda run: install_wgrad_fusion(), "expert_wgrad": lambda run: install_expert_wgrad()}
"""Each replacement's installer, given the run (only vit_attention_pad reads it: its head dim)."""


def install(run: RunConfig) -> list[str]:
    """Put the run's chosen code paths (kernels' and precision's replacements) in place in this training
    process; their names."""
    names = kernels.replacements(run) + precision.replacements(run)
    for name in names:
        INSTALL[name](run)
    return names
