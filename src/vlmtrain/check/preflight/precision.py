"""Preflight rules: precision x hardware, data, layout and CUDA graphs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlmtrain.check.preflight.registry import Severity, rule
from vlmtrain.config.groups import cuda_graph, precision
from vlmtrain.config.groups.kernels import GroupedGemm
from vlmtrain.config.groups.parallelism import is_fsdp
from vlmtrain.config.groups.precision import Format, Scaling, VisionPrecision

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


@rule(Severity.error)
def precision_needs_hardware(run: RunConfig, res: Resolved) -> str | None:
    hw, fmt = run.hardware, run.precision.format
    if precision.sm(hw) >= precision.MIN_SM[fmt]:
        return None
    fix = "precision=fp8 (or precision=bf16)" if precision.sm(hw) >= precision.MIN_SM[Format.fp8] else "precision=bf16"
    return (f"precision={fmt} needs SM {precision.MIN_SM[fmt] / 10:.1f}+ tensor cores; hardware={hw.name} is SM "
            f"{hw.sm_major}.{hw.sm_minor} (Transformer Engine refuses the recipe when the model is built). Use {fix}.")


@rule(Severity.warning)
def fp8_blockwise_off_hopper(run: RunConfig, res: Resolved) -> str | None:
    p, hw = run.precision, run.hardware
    if p.format == Format.fp8 and p.scaling == Scaling.blockwise and hw.sm_major != 9:
        return (f"precision.scaling=blockwise is documented by Bridge as Hopper-only; hardware={hw.name} is SM "
                f"{hw.sm_major}.{hw.sm_minor}. On Blackwell use precision=mxfp8 (hardware block scaling).")
    return None


@rule(Severity.error)
def fp8_delayed_with_bf16_layers(run: RunConfig, res: Resolved) -> str | None:
    p = run.precision
    if p.format == Format.fp8 and p.scaling == Scaling.delayed and any(precision.bf16_layers(run)):
        return ("precision.scaling=delayed cannot keep decoder layers in BF16 (Megatron asserts: delayed scaling "
                "wraps the whole block in one FP8 context). Set precision.bf16_layers_at_start=0 "
                "precision.bf16_layers_at_end=0, or precision.scaling=tensorwise.")
    return None


@rule(Severity.error)
def bf16_layers_fit_each_stage(run: RunConfig, res: Resolved) -> str | None:
    kept = sum(precision.bf16_layers(run))
    if kept and kept >= min(res.stage_sizes):
        return (f"precision={precision.label(run)} keeps {kept} decoder layers per pipeline stage in BF16 "
                f"(precision.bf16_layers_at_start/_end, or the Bridge recipe's own), leaving no quantized layer in a "
                f"stage of {min(res.stage_sizes)}. Set precision.bf16_layers_at_start=0 "
                "precision.bf16_layers_at_end=0, or use precision=bf16.")
    return None


@rule(Severity.warning)
def quantized_unmeasured_combination(run: RunConfig, res: Resolved) -> str | None:
    if not precision.quantized(run):
        return None
    combos = [what for what, on in (
        ("delayed scaling (tensorwise and blockwise are the measured FP8 recipes)",
         run.precision.format == Format.fp8 and run.precision.scaling == Scaling.delayed),
        ("cuda_graph (TE keeps FP8 scaling state inside captured graphs)", cuda_graph.enabled(run)),
        ("kernels.moe_grouped_gemm=cutlass (TE's CUTLASS grouped GEMM was measured in BF16 only)",
         run.kernels.moe_grouped_gemm == GroupedGemm.cutlass),
        ("vision=quantized on a frozen ViT (no backward to speed up there)",
         run.precision.vision == VisionPrecision.quantized and run.vision.freeze_vision_model),
    ) if on]
    if combos:
        return (f"precision={precision.label(run)} with " + "; ".join(combos) + ": no vlmtrain run has measured this "
                "combination (results/precision_h200.jsonl); check loss parity against precision=bf16.")
    return None


@rule(Severity.warning)
def mxfp8_buffer_reuse_off_under_fsdp(run: RunConfig, res: Resolved) -> str | None:
    if run.precision.format == Format.mxfp8 and is_fsdp(run):
        return ("precision=mxfp8 with parallelism=fsdp: Bridge turns reuse_grad_buf_for_mxfp8_param_ag off (not "
                "implemented for Megatron-FSDP), so the MXFP8 parameter all-gather takes its own buffer; the memory "
                "estimate does not count it. parallelism=3d keeps the reuse.")
    return None


@rule(Severity.warning)
def precision_aware_optimizer_under_fsdp(run: RunConfig, res: Resolved) -> str | None:
    """Megatron-FSDP shards the optimizer its own way; the precision-aware optimizer was trained under 3D only."""
    if run.precision.precision_aware_optimizer and is_fsdp(run):
        return ("precision.precision_aware_optimizer=true with parallelism=fsdp: vlmtrain has trained with TE's "
                "precision-aware FusedAdam under parallelism=3d only (tests/gpu/test_bridge_patches_gpu.py). Compare "
                "its losses with precision.precision_aware_optimizer=false before relying on it.")
    return None
