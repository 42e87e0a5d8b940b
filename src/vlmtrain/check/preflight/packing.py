"""Preflight rules of data.packing: a packed micro-batch is one row of <= capacity tokens (Resolved.packing_capacity),
binned from the data scan, its segments aligned to Resolved.pack_align, its shape static only where
Resolved.packing_static says so."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vlmtrain.check.preflight.registry import Severity, rule
from vlmtrain.config.groups import precision
from vlmtrain.config.groups.model import Family

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.data.rows import Lengths


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


def unscanned(run: RunConfig) -> bool:
    """Bins are decided from every sample's exact length in the data scan; Energon and mock samples are made in
    the ranks (and hub presets are downloaded there), so there is nothing to bin beforehand."""
    from vlmtrain.config.groups.data import Kind

    d = run.data
    hub = d.kind == Kind.hf and d.path is not None and not Path(d.path).expanduser().exists()
    return d.kind in (Kind.energon, Kind.mock) or hub


def packed_rows(run: RunConfig, res: Resolved) -> tuple[Lengths, int, int] | None:
    """(lengths, training rows, held-out rows) of a packed run's data at its capacity, as the data stage bins them;
    None unpacked, or where the data stage decides (data it cannot count here, a sample longer than the capacity:
    it names them)."""
    from vlmtrain.data import prepare

    cap = res.packing_capacity
    lengths = prepare.lengths(run) if cap else None
    if lengths is None or lengths.longest > cap:
        return None
    return lengths, *lengths.rows(cap, res.pack_align)


@rule(Severity.error)
def packing_needs_scanned_data(run: RunConfig, res: Resolved) -> str | None:
    cap, d = res.packing_capacity, run.data
    if cap and unscanned(run):
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


QWEN35_PACKING_PROVEN: str | None = None
"""The packing equivalence proof's passing Qwen3.5 rows in results/packing_equivalence.jsonl (machine run and
commit, as docs/measurements.md names them), or None while no GPU run has passed: set, packing is allowed."""


@rule(Severity.error)
def qwen35_packing_unverified(run: RunConfig, res: Resolved) -> str | None:
    """Qwen3.5 packs through code no run here has proven equal to per-sample training
    (vlmtrain.lab.checks.packing_equivalence's qwen35 cases); kernels=fast adds none (its replacements are the same
    Qwen3-VL ViT and pinned-pixel paths, and its decoder RoPE replacement only runs on packed rows)."""
    if run.model.family == Family.qwen35_vl and res.packing_capacity and not QWEN35_PACKING_PROVEN:
        return (f"model={run.model.name} with data.packing={res.packing_capacity} is unverified: packed (THD) rows "
                "take Megatron's GatedDeltaNet varlen branch (cu_seqlens into FLA's causal conv and chunked delta "
                "rule; on Hopper TileLang's varlen backward) and TE's fused RoPE on the partial (64 of 256) rotary "
                "dims under kernels=fast. The code supports both, but no GPU run has checked them and Bridge's own "
                "Qwen3.5-VL recipes never pack. Use data.packing=false, or "
                "preflight.ignore=[qwen35_packing_unverified] to run it as that check.")
    return None


@rule(Severity.error)
def quantized_packing_alignment(run: RunConfig, res: Resolved) -> str | None:
    """TE's quantized GEMMs need a token count that is a multiple of 16 (32 for MXFP8/NVFP4). vlmtrain's packed
    collate pads each sample's segment to Resolved.pack_align, which includes that multiple; a row padded to the
    capacity then needs the capacity to be a multiple of it too (the other multiples: packing_capacity_multiple)."""
    mult = precision.gemm_token_multiple(run)
    cap = res.packing_capacity
    if cap and cap % mult:
        return (f"precision={run.precision.format} with data.packing={cap}: the packed row's token count must be "
                f"a multiple of {mult} for TE's quantized GEMMs. Use data.packing={cap // mult * mult or mult}.")
    return None
