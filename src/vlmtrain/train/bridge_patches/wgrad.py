"""wgrad_fusion: Bridge builds the model with gradient_accumulation_fusion off, since Megatron's non-TE linears (the ViT
mergers, the output layer) then call APEX's fused_weight_gradient_mlp_cuda, absent here; so every weight gradient was
written in BF16 and added to its FP32 main grad by Megatron's grad hook (72 ms of adds and 42 ms of GPU idle in a step
of Qwen3-VL-30B-A3B's shapes on one H200, results/profile_h200.jsonl). Here kernels.apply turns the fusion on, the ViT's
config (built from scratch by Bridge) takes it too, and those linears get TE's accumulating GEMM where they ask for
APEX's.

expert_wgrad: TE's GroupedLinear runs each MoE expert's weight gradient as its own cuBLAS GEMM (the token counts
are ragged, which its CUTLASS grouped GEMM cannot take): 128 GEMMs per linear. vlmtrain.train.expert_wgrad runs
them as torch grouped GEMMs instead (its docstring says how and what it leaves to TE).
"""

from __future__ import annotations

from typing import Any

from vlmtrain.train.bridge_patches.replace import replace
from vlmtrain.train.bridge_patches.vit_config import copy_into_vit_config


class TEWgradAccumulation:
    """What Megatron's non-TE linears (the ViT mergers, the output layer) call APEX's fused_weight_gradient_mlp_cuda
    for under gradient_accumulation_fusion, on TE's GEMM: main_grad += grad_output^T @ input, accumulated in
    main_grad's dtype by the GEMM itself, as TE's own linears do."""

    @staticmethod
    def wgrad_gemm_accum_fp32(total_input: Any, grad_output: Any, main_grad: Any) -> None:
        from transformer_engine.pytorch.cpp_extensions import general_gemm

        general_gemm(total_input, grad_output, out_dtype=main_grad.dtype, layout="NT", out=main_grad,
                     accumulate=True, grad=True)

    wgrad_gemm_accum_fp16 = wgrad_gemm_accum_fp32


def install_wgrad_fusion() -> None:
    """wgrad_fusion: weight gradients accumulate into the FP32 main grads inside their GEMMs
    (model.gradient_accumulation_fusion, which kernels.apply sets), in the ViT too, and without APEX."""
    from megatron.core.tensor_parallel import layers

    replace("wgrad_fusion_apex", layers, "fused_weight_gradient_mlp_cuda", TEWgradAccumulation)
    replace("wgrad_fusion_available", layers, "_grad_accum_fusion_available", True)
    copy_into_vit_config("wgrad_fusion", ("gradient_accumulation_fusion",))




def install_expert_wgrad() -> None:
    """expert_wgrad: TE's GroupedLinear backward looks `general_grouped_gemm` up in its module when it runs; the
    experts' BF16 wgrads go to vlmtrain.train.expert_wgrad, everything else to TE's own."""
    from transformer_engine.pytorch.module import grouped_linear

    from vlmtrain.train.expert_wgrad import grouped

    replace("expert_wgrad", grouped_linear, "general_grouped_gemm", grouped(grouped_linear.general_grouped_gemm))
