"""Preflight rules: recompute x CUDA graphs and the Qwen-VL forward step (packing: check.preflight.packing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlmtrain.check.preflight.registry import Severity, bridge, rule
from vlmtrain.config.groups.model import Family
from vlmtrain.config.groups.recompute import Granularity

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


@rule(Severity.error)
def graphs_with_full_recompute(run: RunConfig, res: Resolved) -> str | None:
    if run.cuda_graph.modules and run.recompute.granularity == Granularity.full:
        return ("cuda_graph with recompute=full: TE CUDA graphs assert with full recompute. Use recompute=selective "
                "or cuda_graph=none.")
    return None


@rule(Severity.error)
def deepstack_full_recompute(run: RunConfig, res: Resolved) -> str | None:
    if deepstack_blocks_full_recompute(run) and run.recompute.granularity == Granularity.full:
        return (f"recompute=full with vision={run.choices.get('vision', 'trainable')}: model={run.model.name}'s ViT "
                "inherits full recompute, and Bridge's Qwen3-VL vision block returns the deepstack features from "
                "tensor_parallel.checkpoint outside autograd, so the trainable deepstack mergers get no gradient (3D: "
                "Megatron DDP asserts in zero_grad_buffer, seen on 2 x H200; FSDP: they silently stay untrained). Use "
                "recompute=selective, or vision=frozen_with_projector.")
    return None


def deepstack_blocks_full_recompute(run: RunConfig) -> bool:
    """Trainable deepstack mergers (freeze_vision_projection covers them) would lose their gradient under full
    recompute; the memory rules use this too, so they never suggest recompute=full here."""
    return bool(run.model.vit.deepstack_indexes) and not run.vision.freeze_vision_projection


@rule(Severity.error)
def moe_preprocess_needs_router(run: RunConfig, res: Resolved) -> str | None:
    mods = run.cuda_graph.modules
    if "moe_preprocess" in mods and "moe_router" not in mods:
        return "cuda_graph scope moe_preprocess needs moe_router in cuda_graph.modules."
    return None


@rule(Severity.error)
def moe_recompute_with_router_graph(run: RunConfig, res: Resolved) -> str | None:
    if (run.recompute.granularity == Granularity.selective and "moe" in run.recompute.modules
            and "moe_router" in run.cuda_graph.modules):
        return ("recompute.modules contains moe while cuda_graph captures moe_router (Megatron asserts). Drop moe from "
                "recompute.modules or use cuda_graph=none.")
    return None


@rule(Severity.error)
def qwen3_vl_no_attn_graph(run: RunConfig, res: Resolved) -> str | None:
    if run.model.family == Family.qwen3_vl and "attn" in run.cuda_graph.modules:
        return (f"model={run.model.name} with an attn CUDA-graph scope: Qwen3VLModel cannot capture attention. "
                "Use cuda_graph=moe_router_preprocess.")
    return None


@rule(Severity.error)
def a2a_overlap_with_qwen_vl(run: RunConfig, res: Resolved) -> str | None:
    if bridge(run, "comm_overlap", "overlap_moe_expert_parallel_comm"):
        return ("+bridge.comm_overlap.overlap_moe_expert_parallel_comm: MoE A2A overlap is not supported by the "
                "Qwen-VL forward step (Qwen3VLModel has no build_schedule_plan). Remove it.")
    return None
