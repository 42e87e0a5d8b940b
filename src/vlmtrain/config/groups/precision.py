"""precision group: the number format of the decoder's GEMMs, mapped to Megatron Bridge's mixed-precision recipes.

| option | Bridge recipe (`format` / `scaling`)                          | runs on                         |
|--------|---------------------------------------------------------------|---------------------------------|
| bf16   | bf16_mixed                                                    | every GPU                       |
| fp8    | tensorwise: bf16_with_fp8_current_scaling_mixed               | SM89+ (H100/H200, B200/GB200)   |
|        | blockwise: bf16_with_fp8_subchannel_scaling_mixed             | SM90 only (Bridge: Hopper only) |
|        | delayed: bf16_with_fp8_delayed_scaling_mixed                  | SM89+                           |
| mxfp8  | bf16_with_mxfp8_mixed                                         | SM100+ (B200/GB200)             |
| nvfp4  | bf16_with_nvfp4_mixed                                         | SM100+ (B200/GB200)             |

What stays BF16 (stated, and settable):
- the vision tower: Bridge builds the ViT's TransformerConfig from scratch (get_vision_model_config copies no FP8
  field), so it runs BF16 under every recipe; `vision=quantized` copies the decoder's format into it
  (vlmtrain.train.bridge_patches `vit_quantized`);
- the router: TopKRouter's gating GEMM is a plain torch GEMM, never FP8; it computes in `router_dtype` (fp32, as
  Bridge's Qwen3-VL providers default);
- the first and last `bf16_layers_at_start` / `_end` decoder layers (null keeps the Bridge recipe's own count);
- the embedding, the output layer, norms and attention softmax (TE quantizes Linear GEMMs only).
With any quantized format, MoE routing pads each expert's token count to the quantization block
(moe_router_padding_for_quantization): TE's FP8/FP4 GEMMs need aligned row counts.
`precision_aware_optimizer` keeps Adam's master weights as BF16 weight + remainder (exact FP32) in TE's FusedAdam
(null: off unless the defaults need its memory, vlmtrain.check.defaults).
The recipe's loss_scale is 1.0 under `train.on_nonfinite=skip` (a constant grad scaler, the one Megatron
mechanism that skips an update with non-finite gradients; Bridge copies the recipe's loss_scale into the
optimizer config, so this group, which owns the recipe, writes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.groups.hardware import HardwareConfig
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


class Format(StrEnum):
    bf16 = "bf16"
    fp8 = "fp8"
    mxfp8 = "mxfp8"
    nvfp4 = "nvfp4"


class Scaling(StrEnum):
    tensorwise = "tensorwise"
    blockwise = "blockwise"
    delayed = "delayed"


class VisionPrecision(StrEnum):
    bf16 = "bf16"
    quantized = "quantized"


OWNS = frozenset({"mixed_precision", "model.moe_router_dtype", "model.moe_router_padding_for_quantization",
                  "optimizer.use_precision_aware_optimizer"})

RECIPES = {
    (Format.bf16, None): "bf16_mixed",
    (Format.fp8, Scaling.tensorwise): "bf16_with_fp8_current_scaling_mixed",
    (Format.fp8, Scaling.blockwise): "bf16_with_fp8_subchannel_scaling_mixed",
    (Format.fp8, Scaling.delayed): "bf16_with_fp8_delayed_scaling_mixed",
    (Format.mxfp8, None): "bf16_with_mxfp8_mixed",
    (Format.nvfp4, None): "bf16_with_nvfp4_mixed",
}
"""(format, fp8 scaling) -> the name of Bridge's registered mixed-precision recipe."""

MIN_SM = {Format.bf16: 80, Format.fp8: 89, Format.mxfp8: 100, Format.nvfp4: 100}
"""Lowest compute capability (major*10+minor) whose tensor cores run the format (TE's own checks)."""


@dataclass
class PrecisionConfig:
    format: Format = Format.bf16
    scaling: Scaling = Scaling.tensorwise
    """fp8 only: TE's scaling recipe (tensorwise = current scaling, blockwise = 1x128/128x128 sub-channel)."""
    bf16_layers_at_start: int | None = None
    """Decoder layers kept BF16 at the start (null: the Bridge recipe's own, 1 for fp8 tensorwise, else 0)."""
    bf16_layers_at_end: int | None = None
    """Decoder layers kept BF16 at the end (null: the Bridge recipe's own)."""
    vision: VisionPrecision = VisionPrecision.bf16
    """The ViT's GEMMs: bf16 (what Bridge does) or quantized (the decoder's format)."""
    router_dtype: str = "fp32"
    """The MoE router's gating precision (model.moe_router_dtype: fp32 or fp64); never quantized."""
    precision_aware_optimizer: bool | None = None
    """TE's FusedAdam steps on the FP32 main grads and the BF16 weights in place, its FP32 master weight kept as the
    BF16 weight plus a 16-bit remainder (optimizer.use_precision_aware_optimizer; the same FP32 Adam): no copies
    of grads into and weights out of FP32 optimizer shards, 10 B of optimizer state per parameter instead of 12.
    Its checkpoints' optimizer state is laid out differently (resume with the same setting). null (the default):
    off, unless the run's memory estimate needs it where the run is placed (check.defaults)."""


def quantized(run: RunConfig) -> bool:
    return run.precision.format != Format.bf16


GEMM_TOKEN_MULTIPLE = {Format.bf16: 1, Format.fp8: 16, Format.mxfp8: 32, Format.nvfp4: 32}
"""Tokens a quantized GEMM's input must be a multiple of (TE asserts otherwise): a packed row's segments are
padded to it (config.resolve.Resolved.pack_align)."""


def gemm_token_multiple(run: RunConfig) -> int:
    return GEMM_TOKEN_MULTIPLE[Format(run.precision.format)]


def recipe_name(run: RunConfig) -> str:
    p = run.precision
    return RECIPES[(p.format, p.scaling if p.format == Format.fp8 else None)]


RECIPES_WITHOUT_QUANTIZED_PARAMS = frozenset({"bf16_with_fp8_subchannel_scaling_mixed"})
"""Quantized recipes whose weights stay BF16 (Bridge: fp8_param_gather/fp4_param_gather false): TE then keeps an
FP8 copy of each quantized weight, row- and column-wise (2 B per parameter), across the step's micro-batches. The
others store the weights quantized (1 B + its 1 B transpose on Hopper), the same 2 B as BF16."""
RECIPE_BF16_LAYERS = {"bf16_with_fp8_current_scaling_mixed": (1, 1)}
"""(start, end) decoder layers a Bridge recipe keeps in BF16 on its own; (0, 0) for the others."""


def bf16_layers(run: RunConfig) -> tuple[int, int]:
    """The decoder layers kept BF16 at the start and the end: the settings, else the Bridge recipe's own."""
    p, (start, end) = run.precision, RECIPE_BF16_LAYERS.get(recipe_name(run), (0, 0))
    if not quantized(run):
        return 0, 0
    return (start if p.bf16_layers_at_start is None else p.bf16_layers_at_start,
            end if p.bf16_layers_at_end is None else p.bf16_layers_at_end)


def quantized_layers(run: RunConfig) -> set[int]:
    """Decoder layer indexes whose GEMMs run in the quantized format."""
    start, end = bf16_layers(run)
    n = run.model.num_layers
    return set(range(start, n - end)) if quantized(run) else set()


def weight_cache(run: RunConfig) -> bool:
    """Whether TE holds extra quantized copies of BF16 weights (see RECIPES_WITHOUT_QUANTIZED_PARAMS)."""
    return quantized(run) and recipe_name(run) in RECIPES_WITHOUT_QUANTIZED_PARAMS


def sm(hw: HardwareConfig) -> int:
    return hw.sm_major * 10 + hw.sm_minor


def peak_tflops(run: RunConfig) -> float:
    """The dense peak of the precision's own format on this hardware (the `mfu_precision_peak` denominator)."""
    hw = run.hardware
    peak = {Format.bf16: hw.peak_bf16_tflops, Format.fp8: hw.peak_fp8_tflops, Format.mxfp8: hw.peak_fp8_tflops,
            Format.nvfp4: hw.peak_fp4_tflops}[run.precision.format]
    return peak or hw.peak_bf16_tflops


def label(run: RunConfig) -> str:
    return label_of(run.precision.format, run.precision.scaling, run.precision.vision)


def label_of(fmt: str, scaling: str = Scaling.tensorwise, vision: str = VisionPrecision.bf16) -> str:
    """bf16 | fp8-tensorwise | fp8-blockwise | mxfp8 | nvfp4 (+ '-vit' when the ViT is quantized too); also for
    a saved run config read as plain dicts (the report)."""
    name = f"fp8-{scaling}" if fmt == Format.fp8 else str(fmt)
    return name + ("-vit" if fmt != Format.bf16 and vision == VisionPrecision.quantized else "")


def replacements(run: RunConfig) -> list[str]:
    """The vlmtrain.train.bridge_patches this run puts in place of Bridge code (shown in the dry-run plan)."""
    return ["vit_quantized"] if quantized(run) and run.precision.vision == VisionPrecision.quantized else []


def apply(run: RunConfig, res: Resolved, cfg: ConfigContainer) -> None:
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    p = run.precision
    mp = get_mixed_precision_config(recipe_name(run))
    for side, count in (("start", p.bf16_layers_at_start), ("end", p.bf16_layers_at_end)):
        if count is not None:
            setattr(mp, f"num_layers_at_{side}_in_bf16", count)
    if p.bf16_layers_at_start is not None or p.bf16_layers_at_end is not None:
        mp.first_last_layers_bf16 = bool(mp.num_layers_at_start_in_bf16 or mp.num_layers_at_end_in_bf16)
    if run.train.on_nonfinite == "skip":  # Megatron's ConstantGradScaler: finds Inf/NaN grads, skips the update
        mp.loss_scale = 1.0
    cfg.mixed_precision = mp
    cfg.model.moe_router_dtype = p.router_dtype
    cfg.model.moe_router_padding_for_quantization = quantized(run) and bool(run.model.num_experts)
    cfg.optimizer.use_precision_aware_optimizer = bool(p.precision_aware_optimizer)
