"""Per-GPU peak memory estimate of a composed run: does it fit before it queues?

Pure arithmetic on the RunConfig (no Bridge, no torch import), so preflight and the dry-run plan can call it.
The estimate is for the worst rank: every pipeline stage is estimated and the largest one is reported.

What one rank holds (P = parameters it holds, T = its trainable share; dense parts shard over DP, routed
experts over expert-DP; TP/PP/EP/ETP have already split the model before that):

| layout            | BF16 params      | FP32 main grads  | optimizer (FP32 master + Adam m, v) | FSDP buckets      |
|-------------------|------------------|------------------|-------------------------------------|-------------------|
| parallelism=3d    | 2 P              | 4 T              | 12 T / DP (experts: / expert-DP)     | -                 |
| parallelism=fsdp  | 2 P / DP         | 4 T / DP         | 12 T / DP (experts: / expert-DP)     | 2 T (step end)    |

Activations (decoder, ViT, logits, dispatcher, FSDP unit gathers) live during forward-backward; the FSDP
step-end buckets live after backward. The peak is the persistent state plus the larger of the two phases.
`allocated` is what torch.cuda.max_memory_allocated() reports (it is validated against measured H200 runs in
benchmarks/memory_check.py); `total` adds what the caching allocator does not see (CUDA context, NCCL buffers,
allocator slack) and is compared with the hardware group's `memory_gib`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from vlmtrain.config import world
from vlmtrain.config.groups import precision
from vlmtrain.config.groups.data import Kind as DataKind
from vlmtrain.config.groups.data import pads_to_max_length
from vlmtrain.config.groups.dispatcher import Backend
from vlmtrain.config.groups.model import Family, LinearAttentionConfig
from vlmtrain.config.groups.parallelism import Kind as ParKind
from vlmtrain.config.groups.precision import VisionPrecision
from vlmtrain.config.groups.recompute import Granularity, Method
from vlmtrain.data.realistic import COLLATE_MAX_TOKENS as COLLATE_MAX_IMAGE_TOKENS
from vlmtrain.data.realistic import COLLATE_MIN_TOKENS as COLLATE_MIN_IMAGE_TOKENS

if TYPE_CHECKING:
    from vlmtrain.config.groups.model import ModelConfig
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.config.world import Layout

GIB = 2**30
BF16 = 2
FP32 = 4
QUANTIZED_COPY_BYTES = 2
"""An FP8 weight copy TE builds for a BF16 weight: 1 B row-wise + 1 B column-wise (Hopper's FP8 GEMMs are TN)."""
GRAD_BYTES = FP32
"""Main grads are FP32: vlmtrain builds Bridge's DDP config with grad_reduce_in_fp32=True (build/container.py)."""
OPTIMIZER_BYTES = 3 * FP32
"""Adam under Megatron's distributed optimizer: FP32 master weights + exp_avg + exp_avg_sq = 12 B per param."""
FSDP_STEP_BUFFER_BYTES = BF16
"""Megatron-FSDP holds 2 B per trainable parameter (unsharded on the rank) after backward: measured as the
allocation left after each step beyond params+grads+optimizer in the three FSDP H200 runs (tiny 1 GPU: 0.16 GiB;
30B-shape 1 GPU trainable/frozen: 6.8/6.0 GiB; 30B-shape EP2: 4.6 GiB), and it tracks trainable, not frozen,
parameters. It is not alive at the activation peak (the 30B 1-GPU peak equals its end-of-step allocation), hence
the max() in `MemoryBreakdown.allocated`. Measured only at DP <= 2; assumed unsharded (conservative) beyond."""
LOGITS_BYTES = BF16 + 2 * FP32
"""Per logit element: BF16 output-layer logits + the FP32 copy that Megatron's fused vocab-parallel cross entropy
makes and keeps as softmax for backward + the FP32 gradient built from it. 10 B matches the tiny-model runs,
whose peak is almost only logits: (7.14 - 1.15) GiB / (4096 x 151936) = 10.1 B (3D EP2, seq 4096)."""
PROCESS_OVERHEAD_GIB = 0.25
"""Allocator-visible fixed memory per process (cuBLAS/TE workspaces, RNG tracker states, the batch, loss and
metric buffers). Calibrated on the H200 runs: the allocation left after a step minus params+grads+optimizer(+FSDP
buckets) was 0.22-0.23 GiB in the tiny 3D/FSDP/TP2/PP2 runs and 0.27-0.30 GiB in the 30B-shape runs."""
CONTEXT_OVERHEAD_GIB = 2.0
"""HBM outside torch's caching allocator plus allocator slack: CUDA context (~0.5 GiB on Hopper), NCCL
communicator buffers (~0.2 GiB per communicator in use; Megatron uses TP/DP/EP/expert-DP/PP groups) and the gap
between reserved and allocated memory (0.2-1.3 GiB in the H200 logs, with expandable segments). Not calibrated:
max_memory_allocated() cannot see it. Only `total` (the fit check) includes it."""
FLEX_DISPATCHER_BUFFER_GIB = 1.0
"""DeepEP/HybridEP communication buffers, allocated once per process by Megatron's fused_a2a. Assumed, not
measured (no flex-dispatcher run on record)."""
PATCHES_PER_TOKEN = 4
"""The ViT sees 16x16 patches; the 2x2 merger turns 4 patches into one LLM token."""
VIT_PATCH_INPUT = 3 * 2 * 16 * 16
"""Conv3d input per patch: 3 channels x temporal patch 2 x 16 x 16 px = 1536."""
VIT_POSITION_EMBEDDINGS = 2304
"""Learned ViT position table (num_position_embeddings in the HF config vlmtrain builds)."""
GDN_CONV_KERNEL = 4
"""Gated-DeltaNet depthwise causal conv width (linear_conv_kernel_dim, Qwen3.5 default)."""
GDN_CHUNK = 64
"""Tokens per chunk of FLA's chunked gated-delta rule: it saves a BF16 chunk x chunk WY matrix per value head (its
per-chunk nv x dk x dv states are recomputed in backward, FLA 0.6)."""


# --- parameters ----------------------------------------------------------------------------------------------


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
    norm = 2 * (4 * hv if postshuffle else hv)
    return norm + (16 * hv * hv + 4 * hv + 4 * hv * h) // tp + h


def _vision_params(m: ModelConfig, tp: int) -> tuple[int, int]:
    """(ViT blocks + patch embedding + position table, projector = merger + deepstack mergers)."""
    v = m.vit
    # patch embedding: Conv3d 1536 -> hv with bias; position table 2304 x hv (both replicated)
    vit = VIT_PATCH_INPUT * v.hidden_size + v.hidden_size + VIT_POSITION_EMBEDDINGS * v.hidden_size
    vit += v.depth * _vit_block(v.hidden_size, v.intermediate_size, tp)
    projector = _merger(v.hidden_size, m.hidden_size, tp, postshuffle=False)
    projector += len(v.deepstack_indexes) * _merger(v.hidden_size, m.hidden_size, tp, postshuffle=True)
    return vit, projector


def _is_linear_attention(m: ModelConfig, layer: int) -> bool:
    """Qwen3.5: every `full_attention_interval`-th layer (1-based) is full attention, the rest Gated-DeltaNet."""
    la = m.linear_attention
    return m.family == Family.qwen35_vl and la is not None and (layer + 1) % la.full_attention_interval != 0


def _attention_params(m: ModelConfig, tp: int) -> int:
    """Standard attention: fused input-norm + QKV (Qwen3.5 adds an output gate of nq*d), Q/K RMSNorm, proj."""
    q, kv = m.num_attention_heads * m.head_dim, m.num_query_groups * m.head_dim
    gate = q if m.family == Family.qwen35_vl else 0
    # h (norm) + h*(q + gate + 2kv)/tp + 2d (q/k norms) + q*h/tp
    return m.hidden_size + m.hidden_size * (q + gate + 2 * kv) // tp + 2 * m.head_dim + q * m.hidden_size // tp


def _gdn_params(m: ModelConfig, tp: int) -> int:
    """Gated-DeltaNet (megatron.core.ssm.gated_delta_net): fused norm + in_proj, depthwise conv, dt_bias, A_log,
    gated RMSNorm on dv, out_proj."""
    la = m.linear_attention or LinearAttentionConfig()
    qk, v, h = la.key_head_dim * la.num_key_heads, la.value_head_dim * la.num_value_heads, m.hidden_size
    # in_proj: h*(2qk + 2v + 2nv)/tp + h; conv1d: (2qk + v)*K/tp; dt_bias + A_log: 2nv/tp; out_norm: dv; out_proj
    return (h + h * (2 * qk + 2 * v + 2 * la.num_value_heads) // tp + (2 * qk + v) * GDN_CONV_KERNEL // tp
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
    mixer = _gdn_params(m, lay.tp) if _is_linear_attention(m, layer) else _attention_params(m, lay.tp)
    dense, expert = _moe_params(m, lay)
    return mixer + dense, expert


def stage_params(run: RunConfig, lay: Layout, stage: int) -> StageParams:
    """What one rank of `stage` holds: stage 0 has the ViT, projector and embedding; the last stage the final
    norm and the (untied) output layer; each stage its decoder layers."""
    m, last = run.model, lay.pp - 1
    vit, projector = _vision_params(m, lay.tp) if stage == 0 else (0, 0)
    per_layer = [layer_params(m, lay, i) for i in world.stage_layers(run, lay)[stage]]
    dense, expert = sum(d for d, _ in per_layer), sum(e for _, e in per_layer)
    vocab = m.vocab_size * m.hidden_size // lay.tp  # Bridge does not pad the vocab (should_pad_vocab=False)
    dense += vocab if stage == 0 else 0
    dense += vocab + m.hidden_size if stage == last else 0
    return StageParams(vision=vit, projector=projector, decoder_dense=dense, decoder_expert=expert)


def _split(n: int, frozen: bool) -> dict[str, int]:
    return {"trainable": 0 if frozen else n, "frozen": n if frozen else 0}


def param_counts(run: RunConfig, stage: int | None = None) -> dict[str, dict[str, int]]:
    """Trainable/frozen parameters per tower on one rank, in checks.json's shape (train.after_build.tower_params).

    `stage` defaults to the last pipeline stage: the checks of the GPU runs were written by the last rank. On one
    GPU this is the whole model; EP halves the experts, TP splits the matrices, PP keeps one stage's layers.
    """
    lay = world.layout(run)
    sp = stage_params(run, lay, lay.pp - 1 if stage is None else stage)
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


# --- workload --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One sample of the micro-batch the estimate assumes (the micro-batch holds train.micro_batch_size of them)."""

    seq_len: int
    """Tokens the decoder runs per sample (padded length when Bridge pads)."""
    image_tokens: int
    """LLM image tokens per sample; the ViT sees 4x as many patches."""
    padded: bool
    """True when Bridge pads every sample to train.seq_length (then seq_len is exact, not a bound)."""


def pads(run: RunConfig) -> bool:
    """Bridge pads every sample to seq_length with PP>1 or EP>1 (validate()) and where vlmtrain asks it to (CUDA
    graphs' static shapes or data.pad_to_max_length: config.groups.data.pads_to_max_length), unless data.packing:
    the packing collate keeps real tokens only. train.step_counters.StepCounters counts padded tokens by this rule."""
    if run.data.packing:
        return False
    lay = world.layout(run)
    return lay.pp > 1 or lay.ep > 1 or pads_to_max_length(run)


def _image_tokens(tokens_w: int, tokens_h: int) -> int:
    return min(max(tokens_w * tokens_h, COLLATE_MIN_IMAGE_TOKENS), COLLATE_MAX_IMAGE_TOKENS)


def image_token_bound(run: RunConfig) -> int:
    """Most image tokens one sample can carry, from what the data group declares; seq_length when it declares
    nothing (every token could be an image token)."""
    d, seq = run.data, run.train.seq_length
    if d.kind == DataKind.mock:
        w, h = d.mock_image_size
        return min(seq, d.mock_num_images * _image_tokens(math.ceil(w / 32), math.ceil(h / 32)))
    if d.kind == DataKind.realistic:
        per_image = min(d.payload.image_tokens_max, COLLATE_MAX_IMAGE_TOKENS)
        return min(seq, (len(d.payload.images_per_sample) - 1) * per_image)
    if d.kind == DataKind.sample:  # one photo per row, resized by the collate
        return min(seq, COLLATE_MAX_IMAGE_TOKENS)
    return seq


def default_workload(run: RunConfig) -> Workload:
    """The worst case the plan and preflight assume: seq_length tokens per sample (exact when Bridge pads; an
    upper bound of the data's own length otherwise) carrying the most image tokens the data allows."""
    return Workload(seq_len=run.train.seq_length, image_tokens=image_token_bound(run), padded=pads(run))


# --- activations -----------------------------------------------------------------------------------------------


def _attention_elems(m: ModelConfig) -> int:
    """BF16 elements one standard attention block saves per token for backward (TE, flash attention)."""
    q, kv, h = m.num_attention_heads * m.head_dim, m.num_query_groups * m.head_dim, m.hidden_size
    gate = q if m.family == Family.qwen35_vl else 0
    # 2h: LayerNormLinear input + normed output; q+gate+2kv: fused QKV output (the V view keeps it alive);
    # q+kv: rotated Q, K saved by flash attention; q: attention output (flash backward + proj input);
    # 3 gate: Qwen3.5's output gate keeps FP32 sigmoid(gate) for the multiply and the gated output as proj input
    return 2 * h + (q + gate + 2 * kv) + (q + kv) + q + 3 * gate


def _gdn_elems(m: ModelConfig) -> float:
    """BF16 elements one Gated-DeltaNet block saves per token, from what Megatron's GatedDeltaNet and FLA 0.6 keep
    for backward (read, not measured: the one Qwen3.5 peak on record, 90 GiB at 4 layers, has no workload row)."""
    la = m.linear_attention or LinearAttentionConfig()
    qk, v, nv = la.key_head_dim * la.num_key_heads, la.value_head_dim * la.num_value_heads, la.num_value_heads
    # 2h: in_proj's LayerNormLinear input + normed output; 2qk+v: causal-conv input (the contiguous q|k|v part of
    # in_proj's output); 2qk: L2-norm input; 2*nv*dk + v: the delta rule's q, k (repeated to the nv value heads) and
    # v; nv*chunk: its WY matrix; 3nv: FP32 decay g and beta; 3v: gated-norm input, gate z and out_proj input
    return (2 * m.hidden_size + (2 * qk + v) + 2 * qk + (2 * nv * la.key_head_dim + v) + nv * GDN_CHUNK + 3 * nv
            + 3 * v)


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
    la = m.linear_attention
    if _is_linear_attention(m, layer) and la is not None:
        mixer = _gdn_elems(m) - (la.value_head_dim * la.num_value_heads if "gdn_norm_out" in modules else 0)
    else:
        mixer = _attention_elems(m)
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


def vision_activation_bytes(run: RunConfig, lay: Layout, patches: float, inflight: float) -> float:
    """Saved ViT activations over the micro-batch's patches (PP stage 0 only). The ViT runs at the LM's TP without
    SP, inherits recompute granularity/method/num_layers but not modules (Bridge's get_vision_model_config), and
    saves nothing when frozen (no parameter or input needs a gradient); the mergers save when the projector trains.
    """
    v, vis = run.model.vit, run.vision
    hv, iv, tp = v.hidden_size, v.intermediate_size, lay.tp
    # per block and patch: 2hv norm1 in/out + 2hv norm2 in/out (LayerNormLinear, not TP-split);
    # 3hv QKV output + 2hv rotated Q, K + hv attention output + 2iv fc1 output and GELU output, split by TP
    block = 4 * hv + (6 * hv + 2 * iv) / tp
    # per merger and patch: LayerNorm input + output (hv each per patch), fc1 output + GELU output (hv/tp each)
    mergers = (1 + len(v.deepstack_indexes)) * (2 * hv + 2 * hv / tp)
    merger_bytes = mergers * BF16 * patches if not (vis.freeze_vision_model and vis.freeze_vision_projection) else 0
    if vis.freeze_vision_model:
        return merger_bytes * inflight
    blocks = (VIT_PATCH_INPUT + v.depth * block) * BF16 * patches
    if run.recompute.granularity == Granularity.full:  # keep each block's input; recompute one block at a time
        blocks = (VIT_PATCH_INPUT + v.depth * hv) * BF16 * patches
        return (blocks + merger_bytes) * inflight + block * BF16 * patches
    return (blocks + merger_bytes) * inflight


def logits_bytes(run: RunConfig, lay: Layout, tokens: float) -> float:
    """Output-layer logits and cross-entropy buffers: tokens x vocab/TP x 10 B (LOGITS_BYTES), one micro-batch."""
    return tokens * run.model.vocab_size / lay.tp * LOGITS_BYTES


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


# --- the estimate ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU peak memory in GiB, item by item, for the worst pipeline stage.

    Items are grouped by when they are alive (see `persistent`, `activation_phase`, `fsdp_buckets`) because
    summing everything would count the FSDP step-end buckets and the activations twice.
    """

    params: float
    """BF16 weights held on the rank (FSDP: its shard)."""
    grads: float
    """FP32 main grads of the trainable weights (FSDP: its shard)."""
    optimizer: float
    """FP32 master weights + Adam exp_avg + exp_avg_sq, sharded over DP (experts: expert-DP)."""
    quantized_weights: float
    """TE's FP8 copies (row- and column-wise) of BF16 weights under a recipe that keeps weights BF16."""
    fsdp_buckets: float
    """Megatron-FSDP's step-end BF16 buckets (FSDP_STEP_BUFFER_BYTES); not alive with the activations."""
    fsdp_gather: float
    """Megatron-FSDP's all-gathered units in flight during forward-backward."""
    decoder_activations: float
    """Saved decoder activations of the in-flight micro-batches, after recompute."""
    vision_activations: float
    """Saved ViT + merger activations over the micro-batch's patches (stage 0 only)."""
    logits: float
    """Output logits and cross-entropy buffers of one micro-batch (last stage only)."""
    cuda_graphs: float
    """Static CUDA-graph input/output buffers."""
    dispatcher: float
    """alltoall: one layer's permuted tokens (transient); hybridep/deepep: fixed buffers (persistent)."""
    overhead: float
    """Allocator-visible fixed memory per process (PROCESS_OVERHEAD_GIB, calibrated)."""
    context: float
    """CUDA context, NCCL and allocator slack (CONTEXT_OVERHEAD_GIB); in `total`, not in `allocated`."""
    stage: int = 0
    seq_len: int = 0
    image_tokens: int = 0
    padded: bool = False
    flex_dispatcher: bool = False

    @property
    def persistent(self) -> float:
        """Held for the whole step: weights, grads, optimizer state, graph pools, flex buffers, fixed overhead."""
        flex = self.dispatcher if self.flex_dispatcher else 0.0
        return (self.params + self.quantized_weights + self.grads + self.optimizer + self.cuda_graphs + self.overhead
                + flex)

    @property
    def activation_phase(self) -> float:
        """Alive together at the forward-backward peak (the loss of the last micro-batch in flight)."""
        a2a = 0.0 if self.flex_dispatcher else self.dispatcher
        return self.decoder_activations + self.vision_activations + self.logits + a2a + self.fsdp_gather

    @property
    def allocated(self) -> float:
        """Peak of the caching allocator, comparable with torch.cuda.max_memory_allocated()."""
        return self.persistent + max(self.activation_phase, self.fsdp_buckets)

    @property
    def total(self) -> float:
        """What must fit in the GPU's memory: the allocator peak plus context/NCCL/slack."""
        return self.allocated + self.context

    def items(self) -> dict[str, float]:
        skip = {"stage", "seq_len", "image_tokens", "padded", "flex_dispatcher"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}

    def to_dict(self) -> dict[str, float | int | bool]:
        out: dict[str, float | int | bool] = {k: round(v, 3) if isinstance(v, float) else v
                                              for k, v in asdict(self).items()}
        out.update(allocated=round(self.allocated, 3), total=round(self.total, 3))
        return out


def _trainable(run: RunConfig, sp: StageParams) -> tuple[int, int]:
    """(dense, expert) trainable parameters of a stage: frozen towers get no grads and no optimizer state."""
    v = run.vision
    dense = (0 if v.freeze_vision_model else sp.vision) + (0 if v.freeze_vision_projection else sp.projector)
    if v.freeze_language_model:
        return dense, 0
    return dense + sp.decoder_dense, sp.decoder_expert


def model_state_bytes(run: RunConfig, lay: Layout, sp: StageParams) -> tuple[float, float, float, float]:
    """(BF16 params, FP32 grads, optimizer state, FSDP step-end buckets) bytes one rank holds for `sp`."""
    dense, expert = sp.vision + sp.projector + sp.decoder_dense, sp.decoder_expert
    t_dense, t_expert = _trainable(run, sp)
    optimizer = OPTIMIZER_BYTES * (t_dense / lay.dp + t_expert / lay.expert_dp)
    if run.parallelism.kind == ParKind.fsdp:  # ZeRO-3: weights and grads shard like the optimizer state
        params = BF16 * (dense / lay.dp + expert / lay.expert_dp)
        grads = GRAD_BYTES * (t_dense / lay.dp + t_expert / lay.expert_dp)
        return params, grads, optimizer, FSDP_STEP_BUFFER_BYTES * (t_dense + t_expert)
    return BF16 * (dense + expert), GRAD_BYTES * (t_dense + t_expert), optimizer, 0.0


def _fsdp_gather(run: RunConfig, lay: Layout, layers: range) -> float:
    """ZeRO-3 all-gathers one FSDP unit (a transformer layer) ahead of use: about two units' BF16 weights beyond
    the local shard are alive during forward-backward (zero when DP and expert-DP are 1: nothing is sharded)."""
    if run.parallelism.kind != ParKind.fsdp or not layers:
        return 0.0
    dense, expert = max((layer_params(run.model, lay, i) for i in layers), key=sum)
    return 2 * BF16 * (dense * (1 - 1 / lay.dp) + expert * (1 - 1 / lay.expert_dp))


def quantized_weight_bytes(run: RunConfig, lay: Layout, stage: int) -> float:
    """precision.weight_cache: 2 B per parameter of the stage's quantized decoder layers (and of the ViT when it is
    quantized too), unsharded: TE quantizes the gathered weight (measured: results/precision_h200.jsonl)."""
    if not precision.weight_cache(run):
        return 0.0
    quantized = precision.quantized_layers(run)
    layers = sum(sum(layer_params(run.model, lay, i)) for i in world.stage_layers(run, lay)[stage] if i in quantized)
    vit = stage_params(run, lay, stage).vision if run.precision.vision == VisionPrecision.quantized else 0
    return QUANTIZED_COPY_BYTES * (layers + vit)


def _stage_estimate(run: RunConfig, lay: Layout, stage: int, w: Workload) -> MemoryBreakdown:
    sp = stage_params(run, lay, stage)
    layers = world.stage_layers(run, lay)[stage]
    mbs = run.train.micro_batch_size
    microbatches = max(run.train.global_batch_size // max(mbs * lay.dp, 1), 1)
    inflight = inflight_microbatches(lay, stage, microbatches)
    tokens = mbs * w.seq_len / lay.cp  # per micro-batch on this rank (CP splits the sequence)
    patches = mbs * min(w.image_tokens, w.seq_len) * PATCHES_PER_TOKEN
    params, grads, optimizer, buckets = model_state_bytes(run, lay, sp)
    last = stage == lay.pp - 1
    decoder = decoder_activation_bytes(run, lay, layers, tokens, inflight)
    if last:  # final norm input + output saved for the output layer
        decoder += 2 * run.model.hidden_size * BF16 * tokens / lay.tp
    return MemoryBreakdown(
        params=params / GIB, quantized_weights=quantized_weight_bytes(run, lay, stage) / GIB, grads=grads / GIB,
        optimizer=optimizer / GIB, fsdp_buckets=buckets / GIB,
        fsdp_gather=_fsdp_gather(run, lay, layers) / GIB,
        decoder_activations=decoder / GIB,
        vision_activations=(vision_activation_bytes(run, lay, patches, inflight) if stage == 0 else 0.0) / GIB,
        logits=(logits_bytes(run, lay, tokens) if last else 0.0) / GIB,
        cuda_graphs=cuda_graph_bytes(run, lay, tokens) / GIB,
        dispatcher=dispatcher_bytes(run, lay, tokens) / GIB,
        overhead=PROCESS_OVERHEAD_GIB, context=CONTEXT_OVERHEAD_GIB,
        stage=stage, seq_len=w.seq_len, image_tokens=min(w.image_tokens, w.seq_len), padded=w.padded,
        flex_dispatcher=run.dispatcher.backend != Backend.alltoall,
    )


def estimate(run: RunConfig, workload: Workload | None = None) -> MemoryBreakdown:
    """Peak memory of the worst rank: every pipeline stage is estimated and the largest `total` wins (stage 0
    carries the ViT and embedding, the last stage the output layer and logits).

    `workload` defaults to `default_workload(run)` (the worst case); pass the measured longest sample to compare
    with a real run (benchmarks/memory_check.py).
    """
    lay = world.layout(run)
    w = workload or default_workload(run)
    return max((_stage_estimate(run, lay, s, w) for s in range(lay.pp)), key=lambda b: b.total)


def render(run: RunConfig, b: MemoryBreakdown | None = None) -> list[str]:
    """The dry-run plan's memory section: the breakdown, then total vs the hardware budget and the headroom."""
    b = b or estimate(run)
    budget = run.hardware.memory_gib
    shorter = "packed micro-batches hold only real tokens" if run.data.packing else "unpadded data runs shorter"
    seq = f"seq {b.seq_len} ({'padded' if b.padded else f'worst case; {shorter}'})"
    head = (f"memory:   per-GPU peak estimate, PP stage {b.stage}, MBS {run.train.micro_batch_size} x {seq}, "
            f"{b.image_tokens} image tokens/sample")
    items = "  ".join(f"{k} {v:.2f}" for k, v in b.items().items() if v)
    pct = 100 * b.total / budget if budget else float("inf")
    verdict = "DOES NOT FIT" if b.total > budget else ("tight" if pct > 90 else "fits")
    if not b.padded and b.total > budget:
        verdict += " at this worst case"
    return [head, f"  GiB: {items}",
            f"  total {b.total:.1f} GiB of {budget:.0f} GiB on {run.hardware.name} ({pct:.0f} %), "
            f"headroom {budget - b.total:.1f} GiB: {verdict}"]
