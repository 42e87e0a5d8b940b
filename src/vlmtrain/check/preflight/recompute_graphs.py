"""Preflight rules: recompute x CUDA graphs, packing and the Qwen-VL forward step."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vlmtrain.check.preflight.registry import Severity, bridge, rule
from vlmtrain.config.groups import precision
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
def packing_with_graphs(run: RunConfig, res: Resolved) -> str | None:
    """A capacity makes every packed row the same shape (Resolved.packing_static), which is all the MoE router and
    preprocess graphs need: they see hidden states [capacity, 1, H] and no sequence boundaries. An attention graph
    would also bake in cu_seqlens, which change with every bin (Bridge demands fixed padded cu_seqlens for packed
    attention graphs: training/config.py, offline_packing_specs.pad_cu_seqlens)."""
    cap = res.packing_capacity
    if cap and "attn" in run.cuda_graph.modules:
        return (f"cuda_graph={run.choices.get('cuda_graph', 'custom')} with data.packing={cap}: an attention CUDA "
                "graph replays the sequence boundaries (cu_seqlens) it was captured with, and every bin has "
                "different ones. Use cuda_graph=moe_router_preprocess (static rows are enough for it), or "
                "cuda_graph=none.")
    return None


@rule(Severity.error)
def packing_is_one_bin(run: RunConfig, res: Resolved) -> str | None:
    cap = res.packing_capacity
    if cap and run.train.micro_batch_size != 1:
        return (f"data.packing={cap} with train.micro_batch_size={run.train.micro_batch_size}: with a capacity a "
                "micro-batch is one packed row (one bin of <= capacity tokens), so the row is sized by data.packing "
                "and train.global_batch_size counts rows. Set train.micro_batch_size=1 (and data.packing to the "
                "tokens you want per micro-batch).")
    return None


@rule(Severity.error)
def packing_needs_scanned_data(run: RunConfig, res: Resolved) -> str | None:
    """Bins are decided from every sample's exact length in the data scan; Energon and mock samples are made in
    the ranks (and hub presets are downloaded there), so there is nothing to bin beforehand."""
    from vlmtrain.config.groups.data import Kind

    cap, d = res.packing_capacity, run.data
    hub = d.kind == Kind.hf and d.path is not None and not Path(d.path).expanduser().exists()
    if cap and (d.kind in (Kind.energon, Kind.mock) or hub):
        return (f"data={d.kind} with data.packing={cap}: packing bins the samples by their exact token lengths "
                "before any GPU work, which needs data the scan reads (sample, realistic, jsonl, parquet, or a "
                "local hf dataset). Use data.packing=false, or export the data (`vlmtrain data export`).")
    return None


@rule(Severity.error)
def packing_capacity_multiple(run: RunConfig, res: Resolved) -> str | None:
    """The capacity must hold whole aligned segments; the quantized GEMMs' own multiple is
    quantized_packing_alignment's finding, so this one fires only when that one does not."""
    cap, lay = res.packing_capacity, res.layout
    if cap and cap % res.pack_align and not cap % precision.gemm_token_multiple(run):
        return (f"data.packing={cap} is not a multiple of {res.pack_align}, the multiple every packed sample's "
                f"segment is padded to (CP {lay.cp}: 2 x CP; TP {lay.tp} with sequence parallelism; quantized "
                f"GEMMs: config.groups.precision.GEMM_TOKEN_MULTIPLE), so a full row would not fit. Use "
                f"data.packing={cap // res.pack_align * res.pack_align or res.pack_align}.")
    return None


@rule(Severity.error)
def qwen35_packing_unverified(run: RunConfig, res: Resolved) -> str | None:
    """Qwen3.5 packs through code no run here has executed; kernels=fast adds none (its replacements are the same
    Qwen3-VL ViT and pinned-pixel paths, and its decoder RoPE replacement only runs on packed rows)."""
    if run.model.family == Family.qwen35_vl and res.packing_capacity:
        return (f"model={run.model.name} with data.packing={res.packing_capacity} is unverified: packed (THD) rows "
                "take Megatron's GatedDeltaNet varlen branch (cu_seqlens into FLA's causal conv and chunked delta "
                "rule; on Hopper TileLang's varlen backward) and TE's fused RoPE on the partial (64 of 256) rotary "
                "dims under kernels=fast. The code supports both, but no GPU run has checked them and Bridge's own "
                "Qwen3.5-VL recipes never pack. Use data.packing=false, or "
                "preflight.ignore=[qwen35_packing_unverified] to run it as that check.")
    return None


@rule(Severity.error)
def a2a_overlap_with_qwen_vl(run: RunConfig, res: Resolved) -> str | None:
    if bridge(run, "comm_overlap", "overlap_moe_expert_parallel_comm"):
        return ("+bridge.comm_overlap.overlap_moe_expert_parallel_comm: MoE A2A overlap is not supported by the "
                "Qwen-VL forward step (Qwen3VLModel has no build_schedule_plan). Remove it.")
    return None
