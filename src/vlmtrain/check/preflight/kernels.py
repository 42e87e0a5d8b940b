"""Preflight rules: kernels x hardware, model and layout (the CUTLASS grouped GEMM, the ViT's attention head dim,
weight-gradient fusion), and what Megatron's warning about TE's cross entropy means for this stack."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlmtrain.check.preflight.registry import Severity, rule
from vlmtrain.config import architecture
from vlmtrain.config.groups.kernels import CrossEntropy, ExpertWgrad, GroupedGemm
from vlmtrain.config.groups.parallelism import is_fsdp

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


@rule(Severity.error)
def cutlass_grouped_gemm_needs_sm90(run: RunConfig, res: Resolved) -> str | None:
    hw = run.hardware
    if run.kernels.moe_grouped_gemm == GroupedGemm.cutlass and hw.sm_major != 9:
        return (f"kernels.moe_grouped_gemm=cutlass: Transformer Engine's CUTLASS grouped GEMM is SM90-only, and "
                f"hardware={hw.name} is SM {hw.sm_major}.{hw.sm_minor} (TE would silently fall back). Use "
                "kernels.moe_grouped_gemm=multistream (or kernels=default).")
    return None


@rule(Severity.error)
def vit_attention_head_dim_pads(run: RunConfig, res: Resolved) -> str | None:
    """Padding can only add channels, and the attention kernels take head dims in multiples of 8 up to 256."""
    dim, own = run.kernels.vit_attention_head_dim, architecture.vit_head_dim(run.model)
    if dim is None or (own <= dim <= 256 and dim % 8 == 0):
        return None
    return (f"kernels.vit_attention_head_dim={dim}: model={run.model.name}'s ViT heads have {own} channels, and the "
            f"padded head dim must be a multiple of 8 from {own} to 256. Use e.g. "
            f"kernels.vit_attention_head_dim={max(128, -(-own // 8) * 8)}, or null (the model's).")


@rule(Severity.warning)
def wgrad_fusion_under_fsdp(run: RunConfig, res: Resolved) -> str | None:
    """Megatron-FSDP has its own path for fused weight gradients (TE >= 2.10); this project measured 3D only."""
    if run.kernels.wgrad_fusion and is_fsdp(run):
        return ("kernels.wgrad_fusion=true with parallelism=fsdp: Megatron-FSDP writes fused weight gradients its own "
                "way, and vlmtrain has trained with kernels.wgrad_fusion under parallelism=3d only (tests/gpu/"
                "test_bridge_patches_gpu.py). Compare its losses with kernels.wgrad_fusion=false before relying on it.")
    return None


@rule(Severity.error)
def expert_wgrad_grouped_unfused_only(run: RunConfig, res: Resolved) -> str | None:
    """With fused accumulation the grouped expert wgrad missed TE's gradients on a GPU (docs/measurements.md)."""
    if run.kernels.expert_wgrad == ExpertWgrad.grouped and run.kernels.wgrad_fusion:
        return ("kernels.expert_wgrad=grouped with kernels.wgrad_fusion=true: its accumulated expert weight gradients "
                "did not match TE's GroupedLinear on one H200 (tests/gpu/test_bridge_patches_gpu.py::"
                "test_grouped_expert_wgrad_matches_te_grouped_linear[True]). Use kernels.wgrad_fusion=false or "
                "kernels.expert_wgrad=te.")
    return None


@rule(Severity.info)
def te_cross_entropy_fusion(run: RunConfig, res: Resolved) -> str | None:
    """Megatron Core warns on every run with TE's cross entropy (Megatron-LM's own argument check refuses it, since
    TE's kernel once wrote the logits' gradient in BF16); this stack's TE computes it in FP32, and runs here matched
    Megatron's native cross entropy, so kernels=auto keeps it on SM90: say so where the warning prints."""
    if run.kernels.cross_entropy != CrossEntropy.te:
        return None
    return ("kernels.cross_entropy=te: Megatron Core's warning that TE's fused cross entropy \"has known stability "
            "issues\" is about TE's older kernel, which kept the logits' gradient in BF16; TE 2.20.2 computes it in "
            "FP32 (4 bytes per logit against native's 10). It matched Megatron's native cross entropy within 3.1e-4 "
            "over 8 steps (results/perf_h200x2.jsonl, docs/running.md#fast-defaults); no longer run has compared "
            "them. kernels=fast kernels.cross_entropy=native follows Megatron's advice.")
