"""kernels group: which implementation runs where several compute the same thing.

| option  | MoE expert GEMMs (moe_grouped_gemm)                  | router (router_fusion) | cross entropy |
|---------|------------------------------------------------------|------------------------|---------------|
| default | multistream: a cuBLAS GEMM per local expert, streams | unfused                | native        |
| fast    | cutlass: one CUTLASS grouped GEMM (SM90 only)        | TE fused top-k         | te            |

| option  | rope (packed rows) | vit_positions  | pin_visual_inputs | vit_host_grid | mask_grid_only | wgrad | expert |
|---------|--------------------|----------------|-------------------|---------------|----------------|-------|--------|
| default | Bridge's unfused   | Bridge's loops | false (pageable)  | false         | false          | false | te     |
| fast    | te: fused kernel   | vectorized     | true              | false         | true           | false | te     |

`auto` (the default) is `default` until the run is placed, then vlmtrain.check.defaults turns on every replacement
proven for the model family and hardware (SM90: `fast`, and for Qwen3-VL experiment=perf_h200_best's
vit_attention_head_dim=128, vit_host_grid and, under 3d, wgrad_fusion; elsewhere the fields exact on any GPU),
keeping fields set to other values; what it leaves off, preflight's auto_left_off says. Megatron Core warns on
every run with TE's cross entropy; preflight's te_cross_entropy_fusion says why auto keeps it (measured, FP32 in this
TE).
`default` is what Bridge does unless told otherwise. `fast` is what the kernels sweep measured on 2 x H200
(results/perf_h200x2.jsonl, one machine run, same step-1 loss): CUTLASS grouped GEMM 1.13x useful tokens/s at
packed MBS 8 (TE #2045: per-expert GEMMs are small and many in fine-grained MoE); the fused router and TE cross
entropy 0.97x (no speed change within noise) at 8 GiB less peak memory, which let MBS grow from 8 to 12.
TE reads NVTE_USE_CUTLASS_GROUPED_GEMM from the environment when it runs a grouped GEMM, so `env()` feeds the
resolved env vars (`Resolved.env`, exported by the launcher before torch is imported), not a Bridge field.
`rope`, `vit_positions`, `pin_visual_inputs`, `vit_host_grid`, `mask_grid_only`, `vit_attention_head_dim`,
`wgrad_fusion` and `expert_wgrad` replace Bridge / Megatron / TE code paths that profiles found slow
(vlmtrain.train.bridge_patches says what each does and installs them in each training process, whose loader workers
inherit them); `vit_host_grid` is not in `fast` (docs/measurements.md: the ViT's host syncs); `mask_grid_only` builds
the same rows with less loader CPU (results/collate_cpu.jsonl). `vit_attention_head_dim` (null: the model's) is a
head dim to run the ViT's attention at, zero-padded from the model's: exact, and worth it where the attention kernel
is faster at that dim (vlmtrain.lab.micro.vit_attention measures each). No option sets it: the best dim depends on the
model and the card, and TE keeps the padded tensors (the memory estimate counts them); `experiment=perf_h200_best`
does. `wgrad_fusion` (wgrad) is in that preset too, measured only together with its other changes
(docs/measurements.md), hence not in `fast`; `expert_wgrad` (expert) likewise.
`cache_dir` is where JIT-compiled kernels (Qwen3.5's FLA: Triton, TileLang, TorchInductor) are kept between runs
(null: `data.cache_dir`/kernels); a cluster points it at a shared filesystem (docs/running.md). It writes no Bridge
field: the model group's `env()` exports the cache env vars from `cache_root(run)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

OWNS = frozenset({"model.moe_router_fusion", "model.cross_entropy_fusion_impl", "model.gradient_accumulation_fusion"})
CUTLASS_ENV = "NVTE_USE_CUTLASS_GROUPED_GEMM"


class GroupedGemm(StrEnum):
    multistream = "multistream"
    cutlass = "cutlass"


class CrossEntropy(StrEnum):
    native = "native"
    te = "te"


class Rope(StrEnum):
    unfused = "unfused"
    te = "te"


class VitPositions(StrEnum):
    loop = "loop"
    vectorized = "vectorized"


class ExpertWgrad(StrEnum):
    te = "te"
    grouped = "grouped"


@dataclass
class KernelsConfig:
    moe_grouped_gemm: GroupedGemm = GroupedGemm.multistream
    """TE GroupedLinear backend for the MoE experts; cutlass needs an SM90 GPU (H100/H200)."""
    router_fusion: bool = False
    """TE's fused top-k + softmax/sigmoid router (model.moe_router_fusion)."""
    cross_entropy: CrossEntropy = CrossEntropy.native
    """model.cross_entropy_fusion_impl: te keeps less of the logits around."""
    rope: Rope = Rope.unfused
    """RoPE on packed (THD) rows of the Qwen3-VL ViT and decoder: Bridge's unfused ops or TE's fused kernel."""
    vit_positions: VitPositions = VitPositions.loop
    """Qwen3-VL ViT position embeddings and rotary ids: Bridge's per-image loops or host-built index tensors."""
    pin_visual_inputs: bool = False
    """Let the DataLoader pin the pixel tensors too, so their copy to the GPU is asynchronous."""
    vit_host_grid: bool = False
    """Read the ViT's image grid to the host once per forward: attention lengths as ints, no per-layer syncs."""
    mask_grid_only: bool = False
    """Data loader: Bridge's assistant loss mask re-renders each sample through the processor for token ids; let
    those renders compute image grids only (the same masks, no pixel work)."""
    vit_attention_head_dim: int | None = None
    """Run the ViT's attention at this head dim (a multiple of 8, at least the model's ViT head dim): q, k and v
    zero-padded, the output sliced back, the softmax scale the model's. null: the model's head dim."""
    wgrad_fusion: bool = False
    """Weight-gradient GEMMs accumulate into the FP32 main grads themselves (model.gradient_accumulation_fusion, the
    ViT's too), instead of writing a BF16 gradient that Megatron's grad hook then adds (one more pass over every
    weight per micro-batch). Megatron's non-TE linears get it from TE's GEMM, not APEX."""
    expert_wgrad: ExpertWgrad = ExpertWgrad.te
    """The MoE experts' BF16 weight gradients: te (TE's GroupedLinear: a cuBLAS GEMM per expert, since their token
    counts are ragged) or grouped (torch's grouped GEMM over the ragged tokens, a few kernels per linear; the BF16
    result added to the FP32 main grads, as without wgrad_fusion)."""
    cache_dir: str | None = None
    """Where JIT-compiled kernels are cached between runs (Triton, TileLang, TorchInductor dirs below it); null:
    data.cache_dir/kernels. On a cluster, a shared filesystem path lets every node reuse one compile."""
    auto: bool = False
    """kernels=auto (the default): check.defaults turns on every replacement proven for the model family and
    hardware where the run is placed, each field still at its `default` value; false once settled."""


def cache_root(run: RunConfig) -> Path:
    """The compiled-kernel cache root: kernels.cache_dir, else data.cache_dir/kernels."""
    if run.kernels.cache_dir:
        return Path(run.kernels.cache_dir).expanduser()
    from vlmtrain.config.groups.data import cache_dir

    return cache_dir(run) / "kernels"


def env(run: RunConfig) -> dict[str, str]:
    return {CUTLASS_ENV: "1"} if run.kernels.moe_grouped_gemm == GroupedGemm.cutlass else {}


def apply(run: RunConfig, res: Resolved, cfg: ConfigContainer) -> None:
    cfg.model.moe_router_fusion = run.kernels.router_fusion
    cfg.model.cross_entropy_fusion_impl = str(run.kernels.cross_entropy)
    # off by default: without APEX, Megatron's non-TE linears (the ViT mergers) fail unless wgrad_fusion installs
    cfg.model.gradient_accumulation_fusion = run.kernels.wgrad_fusion


def replacements(run: RunConfig) -> list[str]:
    """The Bridge code paths this run replaces (vlmtrain.train.bridge_patches; shown in the dry-run plan)."""
    k = run.kernels
    chosen = {"rope_te": k.rope == Rope.te, "vit_positions": k.vit_positions == VitPositions.vectorized,
              "pin_visual_inputs": k.pin_visual_inputs, "vit_host_grid": k.vit_host_grid,
              "mask_grid_only": k.mask_grid_only, "vit_attention_pad": k.vit_attention_head_dim is not None,
              "wgrad_fusion": k.wgrad_fusion, "expert_wgrad": k.expert_wgrad == ExpertWgrad.grouped}
    return [name for name, on in chosen.items() if on]
