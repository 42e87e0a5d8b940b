"""Parameters one rank holds, per tower and pipeline stage, counted from the architecture (config.architecture)
as Megatron lays them out: exact against the GPU runs' checks.json (train.after_build.tower_params)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vlmtrain.config import architecture as arch
from vlmtrain.config import world

if TYPE_CHECKING:
    from vlmtrain.config.groups.model import LinearAttentionConfig, ModelConfig
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.config.world import Layout


@dataclass(frozen=True)
class StageParams:
    """Parameters one rank of a pipeline stage holds, after TP/EP/ETP splits and before DP/FSDP sharding."""

    vision: int
    projector: int
    decoder_dense: int
    decoder_expert: int

    @property
    def decoder(self) -> int:
        return self.decoder_dense + self.decoder_expert


def _vit_block(hv: int, iv: int, tp: int) -> int:
    """One ViT block: LayerNorms replicated, QKV/fc1 column-parallel (bias split), proj/fc2 row-parallel."""
    # norm1 + norm2 (weight + bias): 2 * 2hv; qkv: (hv*3hv + 3hv)/tp; proj: hv*hv/tp + hv; fc1: (hv*iv + iv)/tp;
    # fc2: iv*hv/tp + hv
    return 4 * hv + (3 * hv * hv + 3 * hv + hv * hv + hv * iv + iv + iv * hv) // tp + 2 * hv


def _merger(hv: int, h: int, tp: int, postshuffle: bool) -> int:
    """Patch merger (2x2 -> 1): LayerNorm on hv (main) or 4hv (deepstack), fc1 4hv->4hv, fc2 4hv->h."""
    merged = arch.PATCHES_PER_TOKEN * hv
    norm = 2 * (merged if postshuffle else hv)
    return norm + (merged * merged + merged + merged * h) // tp + h


def _vision_params(m: ModelConfig, tp: int) -> tuple[int, int]:
    """(ViT blocks + patch embedding + position table, projector = merger + deepstack mergers)."""
    v = m.vit
    # patch embedding: Conv3d 1536 -> hv with bias; position table 2304 x hv (both replicated)
    vit = arch.VIT_PATCH_INPUT * v.hidden_size + v.hidden_size + arch.VIT_POSITION_EMBEDDINGS * v.hidden_size
    vit += v.depth * _vit_block(v.hidden_size, v.intermediate_size, tp)
    projector = _merger(v.hidden_size, m.hidden_size, tp, postshuffle=False)
    projector += len(v.deepstack_indexes) * _merger(v.hidden_size, m.hidden_size, tp, postshuffle=True)
    return vit, projector


def _attention_params(m: ModelConfig, tp: int) -> int:
    """Standard attention: fused input-norm + QKV (Qwen3.5 adds an output gate of nq*d), Q/K RMSNorm, proj."""
    q, kv = arch.attention_widths(m)
    gate = q if arch.has_output_gate(m) else 0
    # h (norm) + h*(q + gate + 2kv)/tp + 2d (q/k norms) + q*h/tp
    return m.hidden_size + m.hidden_size * (q + gate + 2 * kv) // tp + 2 * m.head_dim + q * m.hidden_size // tp


def _gdn_params(h: int, la: LinearAttentionConfig, tp: int) -> int:
    """Gated-DeltaNet (megatron.core.ssm.gated_delta_net): fused norm + in_proj, depthwise conv, dt_bias, A_log,
    gated RMSNorm on dv, out_proj."""
    qk, v = arch.gdn_widths(la)
    # in_proj: h*(2qk + 2v + 2nv)/tp + h; conv1d: (2qk + v)*K/tp; dt_bias + A_log: 2nv/tp; out_norm: dv; out_proj
    return (h + h * (2 * qk + 2 * v + 2 * la.num_value_heads) // tp + (2 * qk + v) * arch.GDN_CONV_KERNEL // tp
            + 2 * la.num_value_heads // tp + la.value_head_dim + v * h // tp)


def _moe_params(m: ModelConfig, lay: Layout) -> tuple[int, int]:
    """(dense, routed-expert) params of one MoE block: pre-MLP norm, router (replicated), shared expert with its
    sigmoid gate (Qwen3.5), and E/EP experts of gated fc1 (2f) + fc2 (f), split by ETP."""
    h, fs = m.hidden_size, m.shared_expert_ffn_hidden_size
    dense = h + m.num_experts * h + (3 * h * fs // lay.tp + h if fs else 0)
    experts = (m.num_experts // lay.ep) * 3 * h * m.moe_ffn_hidden_size // lay.etp
    return dense, experts


def layer_params(m: ModelConfig, lay: Layout, layer: int) -> tuple[int, int]:
    """(dense, routed-expert) params one rank holds of decoder layer `layer` (attention or Gated-DeltaNet + MoE)."""
    la = arch.layer_gdn(m, layer)
    mixer = _gdn_params(m.hidden_size, la, lay.tp) if la is not None else _attention_params(m, lay.tp)
    dense, expert = _moe_params(m, lay)
    return mixer + dense, expert


def stage_params(run: RunConfig, res: Resolved, stage: int) -> StageParams:
    """What one rank of `stage` holds: stage 0 has the ViT, projector and embedding; the last stage the final
    norm and the (untied) output layer; each stage its decoder layers (res.stage_layers)."""
    lay = res.layout
    m, last = run.model, lay.pp - 1
    vit, projector = _vision_params(m, lay.tp) if stage == 0 else (0, 0)
    per_layer = [layer_params(m, lay, i) for i in res.stage_layers[stage]]
    dense, expert = sum(d for d, _ in per_layer), sum(e for _, e in per_layer)
    vocab = m.vocab_size * m.hidden_size // lay.tp  # Bridge does not pad the vocab (should_pad_vocab=False)
    dense += vocab if stage == 0 else 0
    dense += vocab + m.hidden_size if stage == last else 0
    return StageParams(vision=vit, projector=projector, decoder_dense=dense, decoder_expert=expert)


def _split(n: int, frozen: bool) -> dict[str, int]:
    return {"trainable": 0 if frozen else n, "frozen": n if frozen else 0}


def param_counts(run: RunConfig, res: Resolved, stage: int | None = None) -> dict[str, dict[str, int]]:
    """Trainable/frozen parameters per tower on one rank, in checks.json's shape (train.after_build.tower_params).

    `stage` defaults to the last pipeline stage: the checks of the GPU runs were written by the last rank. On one
    GPU this is the whole model; EP halves the experts, TP splits the matrices, PP keeps one stage's layers.
    """
    sp = stage_params(run, res, res.layout.pp - 1 if stage is None else stage)
    v = run.vision
    return {"vision": _split(sp.vision, v.freeze_vision_model),
            "projector": _split(sp.projector, v.freeze_vision_projection),
            "decoder": _split(sp.decoder, v.freeze_language_model)}


def model_param_count(run: RunConfig) -> int:
    """All parameters of the unsplit model (TP=PP=EP=ETP=1)."""
    one = world.Layout(nodes=1, gpus_per_node=1, tp=1, pp=1, vpp=None, cp=1, ep=1, etp=1)
    m = run.model
    vit, projector = _vision_params(m, 1)
    layers = sum(sum(layer_params(m, one, i)) for i in range(m.num_layers))
    return vit + projector + layers + 2 * m.vocab_size * m.hidden_size + m.hidden_size

