"""The estimate: model state (params, grads, optimizer, FSDP buckets, quantized copies) plus the activation
phase, per pipeline stage; the worst stage is the rank's peak (`estimate`), and `render` prints it for the plan."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from vlmtrain.check.memory.activations import (
    BF16,
    FP32,
    GIB,
    cuda_graph_bytes,
    decoder_activation_bytes,
    dispatcher_bytes,
    inflight_microbatches,
    logits_bytes,
    vision_activation_bytes,
)
from vlmtrain.check.memory.params import StageParams, layer_params, stage_params
from vlmtrain.check.memory.workload import Workload, default_workload
from vlmtrain.config import architecture as arch
from vlmtrain.config.groups import precision
from vlmtrain.config.groups.dispatcher import Backend
from vlmtrain.config.groups.parallelism import is_fsdp
from vlmtrain.config.groups.precision import VisionPrecision

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.config.world import Layout

QUANTIZED_COPY_BYTES = 2
"""An FP8 weight copy TE builds for a BF16 weight: 1 B row-wise + 1 B column-wise (Hopper's FP8 GEMMs are TN)."""
GRAD_BYTES = FP32
"""Main grads are FP32: vlmtrain builds Bridge's DDP config with grad_reduce_in_fp32=True (build/container.py)."""
OPTIMIZER_BYTES = 3 * FP32
"""Adam under Megatron's distributed optimizer: FP32 master weights + exp_avg + exp_avg_sq = 12 B per param."""
REMAINDER_OPTIMIZER_BYTES = BF16 + 2 * FP32
"""precision.precision_aware_optimizer: TE's FusedAdam keeps the master weight as the BF16 weight plus a 16-bit
remainder (Megatron's store_param_remainders), where its weights are BF16 (Megatron: bf16, or fp8 delayed
scaling); its other recipes keep FP32 master weights."""


def keeps_remainders(run: RunConfig) -> bool:
    """precision.precision_aware_optimizer would keep BF16 weights plus remainders (and so save memory) here."""
    p = run.precision
    return p.format == precision.Format.bf16 or (p.format == precision.Format.fp8
                                                 and p.scaling == precision.Scaling.delayed)


def optimizer_bytes(run: RunConfig) -> int:
    """Adam's state per trainable parameter."""
    return REMAINDER_OPTIMIZER_BYTES if run.precision.precision_aware_optimizer and keeps_remainders(run) \
        else OPTIMIZER_BYTES
FSDP_STEP_BUFFER_BYTES = BF16
"""Megatron-FSDP holds 2 B per trainable parameter (unsharded on the rank) after backward: measured as the
allocation left after each step beyond params+grads+optimizer in the three FSDP H200 runs (tiny 1 GPU: 0.16 GiB;
30B-shape 1 GPU trainable/frozen: 6.8/6.0 GiB; 30B-shape EP2: 4.6 GiB), and it tracks trainable, not frozen,
parameters. It is not alive at the activation peak (the 30B 1-GPU peak equals its end-of-step allocation), hence
the max() in `MemoryBreakdown.allocated`. Measured only at DP <= 2; assumed unsharded (conservative) beyond."""
PROCESS_OVERHEAD_GIB = 0.25
"""Allocator-visible fixed memory per process (cuBLAS/TE workspaces, RNG tracker states, the batch, loss and
metric buffers). Calibrated on the H200 runs: the allocation left after a step minus params+grads+optimizer(+FSDP
buckets) was 0.22-0.23 GiB in the tiny 3D/FSDP/TP2/PP2 runs and 0.27-0.30 GiB in the 30B-shape runs."""
TIGHT = 0.9
"""The share of the hardware group's memory_gib above which the estimate leaves too little headroom for what it
does not model (fragmentation, a longer sample than the worst case it assumes): preflight warns (memory_headroom),
and the defaults settle no choice above it."""
CONTEXT_OVERHEAD_GIB = 2.0
"""HBM outside torch's caching allocator plus allocator slack: CUDA context (~0.5 GiB on Hopper), NCCL
communicator buffers (~0.2 GiB per communicator in use; Megatron uses TP/DP/EP/expert-DP/PP groups) and the gap
between reserved and allocated memory (0.2-1.3 GiB in the H200 logs, with expandable segments). Not calibrated:
max_memory_allocated() cannot see it. Only `total` (the fit check) includes it."""


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
    optimizer = optimizer_bytes(run) * (t_dense / lay.dp + t_expert / lay.expert_dp)
    if is_fsdp(run):  # ZeRO-3: weights and grads shard like the optimizer state
        params = BF16 * (dense / lay.dp + expert / lay.expert_dp)
        grads = GRAD_BYTES * (t_dense / lay.dp + t_expert / lay.expert_dp)
        return params, grads, optimizer, FSDP_STEP_BUFFER_BYTES * (t_dense + t_expert)
    return BF16 * (dense + expert), GRAD_BYTES * (t_dense + t_expert), optimizer, 0.0


def _fsdp_gather(run: RunConfig, lay: Layout, layers: range) -> float:
    """ZeRO-3 all-gathers one FSDP unit (a transformer layer) ahead of use: about two units' BF16 weights beyond
    the local shard are alive during forward-backward (zero when DP and expert-DP are 1: nothing is sharded)."""
    if not is_fsdp(run) or not layers:
        return 0.0
    dense, expert = max((layer_params(run.model, lay, i) for i in layers), key=sum)
    return 2 * BF16 * (dense * (1 - 1 / lay.dp) + expert * (1 - 1 / lay.expert_dp))


def quantized_weight_bytes(run: RunConfig, lay: Layout, layers: range, sp: StageParams) -> float:
    """precision.weight_cache: 2 B per parameter of the stage's quantized decoder layers (and of the ViT when it is
    quantized too), unsharded: TE quantizes the gathered weight (measured: results/precision_h200.jsonl)."""
    if not precision.weight_cache(run):
        return 0.0
    quantized = precision.quantized_layers(run)
    decoder = sum(sum(layer_params(run.model, lay, i)) for i in layers if i in quantized)
    vit = sp.vision if run.precision.vision == VisionPrecision.quantized else 0
    return QUANTIZED_COPY_BYTES * (decoder + vit)


def _stage_estimate(run: RunConfig, res: Resolved, stage: int, w: Workload) -> MemoryBreakdown:
    lay, layers = res.layout, res.stage_layers[stage]
    sp = stage_params(run, res, stage)
    mbs = run.train.micro_batch_size
    inflight = inflight_microbatches(lay, stage, max(res.grad_accum, 1))
    tokens = mbs * w.seq_len / lay.cp  # per micro-batch on this rank (CP splits the sequence)
    patches = mbs * min(w.image_tokens, w.seq_len) * arch.PATCHES_PER_TOKEN
    params, grads, optimizer, buckets = model_state_bytes(run, lay, sp)
    last = stage == lay.pp - 1
    decoder = decoder_activation_bytes(run, lay, layers, tokens, inflight)
    if last:  # final norm input + output saved for the output layer
        decoder += 2 * run.model.hidden_size * BF16 * tokens / lay.tp
    return MemoryBreakdown(
        params=params / GIB, quantized_weights=quantized_weight_bytes(run, lay, layers, sp) / GIB, grads=grads / GIB,
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


def estimate(run: RunConfig, res: Resolved, workload: Workload | None = None) -> MemoryBreakdown:
    """Peak memory of the worst rank: every pipeline stage is estimated and the largest `total` wins (stage 0
    carries the ViT and embedding, the last stage the output layer and logits).

    `workload` defaults to `default_workload(run, res)` (the worst case); pass the measured longest sample to
    compare with a real run (vlmtrain.lab.calibrate.memory_check).
    """
    w = workload or default_workload(run, res)
    return max((_stage_estimate(run, res, s, w) for s in range(res.layout.pp)), key=lambda b: b.total)


def render(run: RunConfig, res: Resolved, b: MemoryBreakdown | None = None) -> list[str]:
    """The dry-run plan's memory section: the breakdown, then total vs the hardware budget and the headroom."""
    b = b or estimate(run, res)
    budget = run.hardware.memory_gib
    packed = res.packing_capacity
    shorter = "a packed row holds <= capacity real tokens" if packed else "unpadded data runs shorter"
    seq = f"seq {b.seq_len} ({'padded' if b.padded else f'worst case; {shorter}'})"
    unit = "1 packed row" if packed else f"MBS {run.train.micro_batch_size}"
    head = (f"memory:   per-GPU peak estimate, PP stage {b.stage}, {unit} x {seq}, "
            f"{b.image_tokens} image tokens/{'row' if packed else 'sample'}")
    items = "  ".join(f"{k} {v:.2f}" for k, v in b.items().items() if v)
    pct = 100 * b.total / budget if budget else float("inf")
    verdict = "DOES NOT FIT" if b.total > budget else ("tight" if pct > 90 else "fits")
    if not b.padded and b.total > budget:
        verdict += " at this worst case"
    return [head, f"  GiB: {items}",
            f"  total {b.total:.1f} GiB of {budget:.0f} GiB on {run.hardware.name} ({pct:.0f} %), "
            f"headroom {budget - b.total:.1f} GiB: {verdict}"]
