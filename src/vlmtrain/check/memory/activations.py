"""Bytes live during forward-backward on one rank: saved decoder and ViT activations (after recompute), logits
and cross-entropy buffers, CUDA-graph static buffers, dispatcher buffers, and the in-flight micro-batches."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from vlmtrain.config import architecture as arch
from vlmtrain.config.groups.dispatcher import Backend
from vlmtrain.config.groups.kernels import CrossEntropy
from vlmtrain.config.groups.recompute import Granularity, Method

if TYPE_CHECKING:
    from vlmtrain.config.groups.model import LinearAttentionConfig, ModelConfig
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.config.world import Layout

GIB = 2**30
BF16 = 2
FP32 = 4
LOGITS_BYTES = {CrossEntropy.native: BF16 + 2 * FP32, CrossEntropy.te: 2 * BF16}
"""Per logit element, by kernels.cross_entropy. native: BF16 output-layer logits + the FP32 copy that Megatron's
fused vocab-parallel cross entropy makes and keeps as softmax for backward + the FP32 gradient built from it; 10 B
matches the tiny-model runs, whose peak is almost only logits: (7.14 - 1.15) GiB / (4096 x 151936) = 10.1 B (3D EP2,
seq 4096). te: the BF16 logits + the BF16 copy TE's cross entropy saves for backward (its backward writes the
gradient into that copy); vlmtrain.lab.micro.logits_memory measures both (results/logits_memory_h200.jsonl)."""
FLEX_DISPATCHER_BUFFER_GIB = 1.0
"""DeepEP/HybridEP communication buffers, allocated once per process by Megatron's fused_a2a. Assumed, not
measured (no flex-dispatcher run on record)."""
GDN_CHUNK = 64
"""Tokens per chunk of FLA's chunked gated-delta rule: it saves a BF16 chunk x chunk WY matrix per value head (its
per-chunk nv x dk x dv states are recomputed in backward, FLA 0.6)."""


def _attention_elems(m: ModelConfig) -> int:
    """BF16 elements one standard attention block saves per token for backward (TE, flash attention)."""
    (q, kv), h = arch.attention_widths(m), m.hidden_size
    gate = q if arch.has_output_gate(m) else 0
    # 2h: LayerNormLinear input + normed output; q+gate+2kv: fused QKV output (the V view keeps it alive);
    # q+kv: rotated Q, K saved by flash attention; q: attention output (flash backward + proj input);
    # 3 gate: Qwen3.5's output gate keeps FP32 sigmoid(gate) for the multiply and the gated output as proj input
    return 2 * h + (q + gate + 2 * kv) + (q + kv) + q + 3 * gate


def _gdn_elems(h: int, la: LinearAttentionConfig) -> float:
    """BF16 elements one Gated-DeltaNet block saves per token, from what Megatron's GatedDeltaNet and FLA 0.6 keep
    for backward (read, not measured: the one Qwen3.5 peak on record, 90 GiB at 4 layers, has no workload row)."""
    (qk, v), nv = arch.gdn_widths(la), la.num_value_heads
    # 2h: in_proj's LayerNormLinear input + normed output; 2qk+v: causal-conv input (the contiguous q|k|v part of
    # in_proj's output); 2qk: L2-norm input; 2*nv*dk + v: the delta rule's q, k (repeated to the nv value heads) and
    # v; nv*chunk: its WY matrix; 3nv: FP32 decay g and beta; 3v: gated-norm input, gate z and out_proj input
    return 2 * h + (2 * qk + v) + 2 * qk + (2 * nv * la.key_head_dim + v) + nv * GDN_CHUNK + 3 * nv + 3 * v


def _moe_elems(m: ModelConfig, etp: int, modules: frozenset[str]) -> float:
    """BF16 elements one MoE block saves per token, after selective recompute of `modules`."""
    h, k, f, fs = m.hidden_size, m.moe_topk, m.moe_ffn_hidden_size, m.shared_expert_ffn_hidden_size
    # 2h: pre-MLP norm input + output (router and dispatch input); 4E: FP32 router logits + probs
    # (2 x E x 4 B); k*h: dispatched tokens (grouped-GEMM fc1 input); 2kf/etp: fc1 output (gate + up);
    # kf/etp: SwiGLU output (fc2 input); k*h: expert output kept for the probability-weighted unpermute
    routed = 4 * m.num_experts + k * h + 2 * k * f / etp + (0 if "moe_act" in modules else k * f / etp) + k * h
    shared = (0 if "shared_experts" in modules else 3 * fs + h) if fs else 0
    norm_out = 0 if "layernorm" in modules else h
    if "moe" in modules:  # the whole MoE block is recomputed from its input
        return h + norm_out
    return h + norm_out + routed + shared


def _layer_elems(m: ModelConfig, layer: int, etp: int, modules: frozenset[str]) -> float:
    """BF16 elements a decoder layer saves per token. Selective `core_attn` saves nothing measurable with flash
    attention (its inputs and output stay saved by the neighbouring GEMMs)."""
    la = arch.layer_gdn(m, layer)
    if la is not None:
        _, v = arch.gdn_widths(la)
        mixer = _gdn_elems(m.hidden_size, la) - (v if "gdn_norm_out" in modules else 0)
    else:
        mixer = _attention_elems(m)
    return mixer + _moe_elems(m, etp, modules)
    return mixer + _moe_elems(m, etp, modules)


def decoder_activation_bytes(run: RunConfig, lay: Layout, layers: range, tokens: float, inflight: float) -> float:
    """Saved decoder activations on one rank: `tokens` per micro-batch (already / CP), SP splits them by TP.

    none/selective: every layer's saved tensors for each in-flight micro-batch. full (uniform, N layers per
    chunk): each chunk keeps only its BF16 input per micro-batch, plus one chunk recomputed in backward; block:
    the first N layers recompute, the rest keep everything.
    """
    m, r = run.model, run.recompute
    modules = frozenset(r.modules) if r.granularity == Granularity.selective else frozenset()
    per_layer = [_layer_elems(m, i, lay.etp, modules) * BF16 * tokens / lay.tp for i in layers]
    if r.granularity != Granularity.full or not per_layer:
        return sum(per_layer) * inflight
    layer_input = m.hidden_size * BF16 * tokens / lay.tp
    n = max(r.num_layers, 1)
    if r.method == Method.block:
        kept = sum(per_layer[n:]) + min(n, len(per_layer)) * layer_input
        return kept * inflight + max(per_layer[:n] or [0])
    chunks = math.ceil(len(per_layer) / n)
    return chunks * layer_input * inflight + max(sum(per_layer[i:i + n]) for i in range(0, len(per_layer), n))


def vit_padding_elems(run: RunConfig) -> float:
    """Extra elements per ViT block and patch under kernels.vit_attention_head_dim: TE keeps the padded q, k, v and
    output beside the unpadded tensors, plus the sliced output copy: 4 (D / d - 1) + 1 hidden widths. With
    Qwen3-VL-30B-A3B's shapes at 4 layers on one H200, 72 -> 128 raised the measured peak from 113.6 to 123.7 GiB
    (results/perf_h200.jsonl); this term gives 10.0 GiB at the ~42k patches of a row's ~10.5k image
    tokens."""
    dim, own = run.kernels.vit_attention_head_dim, arch.vit_head_dim(run.model)
    if dim is None or dim == own:
        return 0.0
    return (4 * (dim / own - 1) + 1) * run.model.vit.hidden_size


def vision_activation_bytes(run: RunConfig, lay: Layout, patches: float, inflight: float) -> float:
    """Saved ViT activations over the micro-batch's patches (PP stage 0 only). The ViT runs at the LM's TP without
    SP, inherits recompute granularity/method/num_layers but not modules (Bridge's get_vision_model_config), and
    saves nothing when frozen (no parameter or input needs a gradient); the mergers save when the projector trains.
    """
    v, vis = run.model.vit, run.vision
    hv, iv, tp = v.hidden_size, v.intermediate_size, lay.tp
    # per block and patch: 2hv norm1 in/out + 2hv norm2 in/out (LayerNormLinear, not TP-split);
    # 3hv QKV output + 2hv rotated Q, K + hv attention output + 2iv fc1 output and GELU output, split by TP
    block = 4 * hv + (6 * hv + 2 * iv + vit_padding_elems(run)) / tp
    # per merger and patch: LayerNorm input + output (hv each per patch), fc1 output + GELU output (hv/tp each)
    mergers = (1 + len(v.deepstack_indexes)) * (2 * hv + 2 * hv / tp)
    merger_bytes = mergers * BF16 * patches if not (vis.freeze_vision_model and vis.freeze_vision_projection) else 0
    if vis.freeze_vision_model:
        return merger_bytes * inflight
    blocks = (arch.VIT_PATCH_INPUT + v.depth * block) * BF16 * patches
    if run.recompute.granularity == Granularity.full:  # keep each block's input; recompute one block at a time
        blocks = (arch.VIT_PATCH_INPUT + v.depth * hv) * BF16 * patches
        return (blocks + merger_bytes) * inflight + block * BF16 * patches
    return (blocks + merger_bytes) * inflight


def logits_bytes(run: RunConfig, lay: Layout, tokens: float) -> float:
    """Output-layer logits and cross-entropy buffers of one micro-batch: tokens x vocab/TP x LOGITS_BYTES."""
    return tokens * run.model.vocab_size / lay.tp * LOGITS_BYTES[run.kernels.cross_entropy]


def cuda_graph_bytes(run: RunConfig, lay: Layout, tokens: float) -> float:
    """TE per-layer CUDA graphs (one per layer and micro-batch, Megatron's TECudaGraphHelper). With TE >= 2.7
    Megatron passes _reuse_graph_input_output_buffers=True, so one set of static forward/backward input and output
    buffers is shared across layers and micro-batches (2 x (in + out)); activations saved inside a graph live in
    its pool instead of the eager allocator and are already counted as activations. The tiny graphed H200 run
    showed no measurable extra over the padded estimate; larger models are not measured."""
    mods, m = set(run.cuda_graph.modules), run.model
    h, e = m.hidden_size * BF16, m.num_experts
    io = 0.0
    if "attn" in mods:
        io += 2 * h  # hidden in, attention output out
    if "moe_router" in mods:
        io += h + e * (FP32 + 1)  # hidden in; FP32 probs and bool routing map out
    if "moe_preprocess" in mods:
        io += m.moe_topk * 8  # int64 permutation indices
    if "moe" in mods or "mlp" in mods:
        io += 2 * h
    return 2 * io * tokens / lay.tp


def dispatcher_bytes(run: RunConfig, lay: Layout, tokens: float) -> float:
    """Flex (HybridEP/DeepEP): fixed buffers allocated once per process. alltoall: the permuted tokens of one
    layer before the exchange, tokens x top_k x h BF16 / TP (the received copy is counted as activations)."""
    m = run.model
    if m.num_experts == 0:
        return 0.0
    if run.dispatcher.backend != Backend.alltoall:
        return FLEX_DISPATCHER_BUFFER_GIB * GIB
    return tokens * m.moe_topk * m.hidden_size * BF16 / lay.tp


def inflight_microbatches(lay: Layout, stage: int, microbatches: int) -> float:
    """Micro-batches whose activations a stage holds at its peak under 1F1B: pp - stage (capped by the count);
    interleaved (VPP) holds ((pp - stage - 1) * 2 + (vpp - 1) * pp + 1) model-chunk micro-batches of 1/vpp size."""
    if lay.pp == 1:
        return 1.0
    vpp = lay.vpp or 1
    if vpp == 1:
        return float(min(microbatches, lay.pp - stage))
    chunks = (lay.pp - stage - 1) * 2 + (vpp - 1) * lay.pp + 1
    return min(float(microbatches), chunks / vpp)

