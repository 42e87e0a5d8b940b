"""Each term of a step on one rank, in FLOPs, bytes or launches first and seconds second, so a test can count it
by hand: the towers' compute per micro-batch, the MoE dispatch, tensor-parallel collectives, Megatron-FSDP's
gathers and reduce-scatters, the DDP gradient reduce-scatter and parameter all-gather, pipeline sends, the
optimizer's memory traffic, and the host's launches.

Where a group's ranks sit: Megatron orders dense ranks tp-cp-dp-pp and expert ranks etp-ep-edp-pp (TP innermost),
so a group of `size` ranks with `stride` spans stride x size consecutive ranks; it stays on NVLink while that span
fits the hardware group's NVLink domain, else its ring runs at the NIC's bandwidth (`link_bw`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vlmtrain.check.memory.estimate import GRAD_BYTES, optimizer_bytes
from vlmtrain.check.memory.params import stage_params
from vlmtrain.config import architecture as arch
from vlmtrain.config import flops
from vlmtrain.config.groups import precision
from vlmtrain.config.groups.dispatcher import Backend
from vlmtrain.config.groups.parallelism import is_fsdp
from vlmtrain.config.groups.recompute import Granularity

if TYPE_CHECKING:
    from vlmtrain.check.speed.calibration import Calibration
    from vlmtrain.check.speed.workload import Workload
    from vlmtrain.config.groups.hardware import HardwareConfig
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.config.world import Layout

BF16 = 2
GB = 1e9
NVLINK_FRACTION = 0.9
"""Share of the NVLink datasheet bandwidth NCCL collectives reach at messages of MBs: nccl-tests' all_reduce busbw
on 8 x H100 SXM is 460-480 GB/s at large sizes against the 450 GB/s one-direction figure
(https://docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests), rounded down for smaller messages. Not fitted:
the measured rows span one or two GPUs."""
NIC_FRACTION = 0.8
"""Share of the NIC's bandwidth collectives leaving the NVLink domain reach: assumed (about 40 of a 400 Gb/s
ConnectX-7's 50 GB/s); no measured row spans two nodes to fit it."""
DDP_BUCKET_PARAMS = 40_000_000
"""Megatron Core's default DDP bucket: max(40M, 1M x DP) parameters (DistributedDataParallelConfig.bucket_size)."""
DDP_BUCKET_PARAMS_PER_DP = 1_000_000
A2A_PER_MOE_LAYER = 4
"""All-to-alls per MoE layer and micro-batch: dispatch and combine in forward, their mirrors in backward."""
TP_COLLECTIVES_PER_LAYER = 8
"""Sequence-parallel collectives per decoder layer and micro-batch: an all-gather before and a reduce-scatter after
attention and after the MLP, forward and backward."""
VIT_ALLREDUCES_PER_BLOCK = 4
"""The ViT runs TP without sequence parallelism: an all-reduce after attention and after the MLP, forward and
backward."""
ELEMENTWISE_MODULES = frozenset({"moe_act", "layernorm", "gdn_norm_out"})
"""Selective-recompute modules that are elementwise: they cost memory traffic, no GEMM FLOPs."""


def microbatches(res: Resolved) -> int:
    """Micro-batches each rank runs per step (Resolved.grad_accum)."""
    return max(res.grad_accum, 1)


def domain_size(hw: HardwareConfig, lay: Layout) -> int:
    """GPUs one NVLink domain holds for this world: the hardware group's (multi-node NVLink), else one node's."""
    return hw.nvlink_domain_size if hw.mnnvl else min(hw.nvlink_domain_size, lay.gpus_per_node)


def link_bw(hw: HardwareConfig, lay: Layout, span: int) -> float:
    """Achieved bytes/s of a ring over `span` consecutive ranks: NVLink inside the domain, the NIC beyond it."""
    if span <= domain_size(hw, lay):
        return hw.nvlink_gb_per_s * GB * NVLINK_FRACTION
    return hw.scaleout_gb_per_s * GB * NIC_FRACTION


def ring_s(full_bytes: float, ranks: int, bw: float) -> float:
    """A ring all-gather or reduce-scatter of a `full_bytes` tensor: each rank moves (n - 1)/n of it."""
    return 0.0 if ranks <= 1 else full_bytes * (ranks - 1) / ranks / bw


def _layers(res: Resolved, stage: int) -> range:
    return res.stage_layers[stage]


def recompute_forward_share(run: RunConfig, part: str) -> float:
    """Extra forward passes recompute adds to `part` (vit, dense, expert, attention): full recompute reruns every
    forward of the towers it covers (the ViT inherits it); selective reruns its modules (core_attn: the attention
    core; moe: the MoE block; shared_experts, mlp), elementwise modules add no GEMM FLOPs."""
    r = run.recompute
    if r.granularity == Granularity.full:
        return 1.0
    if r.granularity != Granularity.selective or part == "vit":
        return 0.0
    mods = set(r.modules)
    return float({"attention": "core_attn" in mods, "expert": "moe" in mods,
                  "dense": bool(mods & {"shared_experts", "mlp"})}.get(part, False))


@dataclass(frozen=True)
class StageFlops:
    """FLOPs one rank of a pipeline stage runs per micro-batch, by op class (padding and recompute included)."""

    vit: float
    dense: float
    attention: float
    expert: float


def decoder_split(run: RunConfig, row_tokens: float) -> tuple[float, float, float]:
    """(dense GEMM, attention core, routed expert) shares of the decoder's forward FLOPs at a row of `row_tokens`
    (config.flops.decoder_forward's terms)."""
    m = run.model
    s = max(round(row_tokens), 1)
    total = flops.decoder_forward(m, [s])
    n_full = arch.layer_types(m).count("full_attention")
    attention = n_full * 2 * m.num_attention_heads * m.head_dim * s * s
    expert = s * m.num_layers * m.moe_topk * 6 * m.hidden_size * m.moe_ffn_hidden_size
    return (total - attention - expert) / total, attention / total, expert / total


def stage_flops(run: RunConfig, res: Resolved, w: Workload, stage: int) -> StageFlops:
    """Per rank and micro-batch of `stage`: the decoder FLOPs of the rows that run (padded or unpadded rows:
    config.flops over each row's run length, attention over the whole row; packed rows: the workload's useful FLOPs,
    whose attention is per sample, scaled to the row's tokens), split into op classes, the stage's share of the
    layers, divided over DP x TP x CP; the ViT and projector (stage 0 only) over DP x TP (CP does not split the
    ViT); plus recompute's extra forwards."""
    lay, m = res.layout, run.model
    mb = microbatches(res)
    vit_b, proj_b, dec_b = flops.backward_factors(run)
    rows = max(run.train.global_batch_size / run.train.micro_batch_size if res.packing_capacity else w.samples, 1.0)
    row = w.decoder_tokens / rows
    dense_s, attn_s, expert_s = decoder_split(run, row)
    share = len(_layers(res, stage)) / m.num_layers / (lay.dp * lay.tp * lay.cp * mb)
    if res.packing_capacity:
        run_dec = w.flops.decoder * (w.decoder_tokens / w.useful_tokens if w.useful_tokens else 1.0)
    else:
        run_dec = rows * flops.decoder_forward(m, [max(round(row), 1)]) * (1 + dec_b)
    fwd = run_dec / (1 + dec_b)  # one forward of the decoder at the run tokens

    def part(frac: float, name: str) -> float:
        return (run_dec * frac + fwd * frac * recompute_forward_share(run, name)) * share

    vit = 0.0
    if stage == 0 and w.vision:
        vit_fwd = w.flops.vit / (1 + vit_b) + w.flops.projector / (1 + proj_b)
        vit = (w.flops.vit + w.flops.projector + vit_fwd * recompute_forward_share(run, "vit")
               * (not run.vision.freeze_vision_model)) / (lay.dp * lay.tp * mb)
    return StageFlops(vit=vit, dense=part(dense_s, "dense"), attention=part(attn_s, "attention"),
                      expert=part(expert_s, "expert"))


def compute_s(run: RunConfig, res: Resolved, stage: int, f: StageFlops, cal: Calibration) -> tuple[float, float]:
    """(ViT, decoder) seconds of one micro-batch's FLOPs at the achieved rates: the ViT at the BF16 peak (unless
    precision.vision=quantized), the decoder's GEMMs at the precision's own peak (config.groups.precision); the
    routed experts add a fixed time per local expert and layer (their GEMMs are as many as the rank's experts)."""
    bf16 = run.hardware.peak_bf16_tflops * 1e12
    dec_peak = precision.peak_tflops(run) * 1e12
    vit_peak = dec_peak if run.precision.vision == "quantized" else bf16
    cutlass = run.kernels.moe_grouped_gemm == "cutlass"
    local = run.model.num_experts / res.layout.ep if run.model.num_experts else 0
    fixed = local * len(_layers(res, stage)) * (cal.expert_cutlass_gemm_s if cutlass else cal.expert_gemm_s)
    decoder = (f.dense + f.attention) / (dec_peak * cal.dense_fraction) + f.expert / (dec_peak * cal.expert_fraction)
    return f.vit / (vit_peak * cal.vit_fraction), decoder + fixed


def tokens_per_rank(res: Resolved, w: Workload) -> float:
    """Decoder tokens one rank holds per micro-batch: a DP replica's share of the step's run tokens, split by CP
    and (sequence parallelism) TP."""
    lay = res.layout
    return w.decoder_tokens / (lay.dp * microbatches(res)) / (lay.cp * lay.tp)


def dispatch_bytes(run: RunConfig, res: Resolved, w: Workload) -> tuple[float, float]:
    """(NVLink, network) bytes one rank sends in one MoE all-to-all: each of its tokens goes to top-k experts, a
    (EP - 1)/EP share of them on other ranks; the share of those in other NVLink domains goes over the network.
    HybridEP/DeepEP send a token once per remote domain instead of once per expert there (the expected distinct
    domains among top-k uniform picks: D (1 - (1 - 1/D)^k) of k)."""
    lay, m, hw = res.layout, run.model, run.hardware
    if not m.num_experts or lay.ep <= 1:
        return 0.0, 0.0
    sent = tokens_per_rank(res, w) * m.moe_topk * m.hidden_size * BF16
    in_domain = max(min(lay.ep * lay.etp, domain_size(hw, lay)) // lay.etp, 1)
    remote = (lay.ep - in_domain) / lay.ep
    local_other = (in_domain - 1) / lay.ep
    network = sent * remote
    domains = lay.ep / in_domain
    if network and run.dispatcher.backend != Backend.alltoall:
        k = m.moe_topk
        network *= domains * (1 - (1 - 1 / domains) ** k) / k
    return sent * local_other, network


def dispatch_s(run: RunConfig, res: Resolved, w: Workload, stage: int) -> float:
    """MoE all-to-alls of one micro-batch on `stage`: A2A_PER_MOE_LAYER per layer (two more per recomputed MoE),
    NVLink and network parts at once. Not overlapped: Megatron overlaps them with compute only under
    overlap_moe_expert_parallel_comm, which the Qwen-VL step does not support."""
    nvl, net = dispatch_bytes(run, res, w)
    if not nvl and not net:
        return 0.0
    hw = run.hardware
    one = max(nvl / (hw.nvlink_gb_per_s * GB * NVLINK_FRACTION), net / (hw.scaleout_gb_per_s * GB * NIC_FRACTION))
    per_layer = A2A_PER_MOE_LAYER + 2 * recompute_forward_share(run, "expert")
    return one * per_layer * len(_layers(res, stage))


def tensor_parallel_s(run: RunConfig, res: Resolved, w: Workload, stage: int) -> float:
    """TP collectives of one micro-batch (exposed: vlmtrain leaves TE's tp_comm_overlap off): the decoder's
    sequence-parallel all-gathers and reduce-scatters of tokens x hidden BF16, and on stage 0 the ViT's all-reduces
    of patches x ViT hidden."""
    lay = res.layout
    if lay.tp <= 1:
        return 0.0
    bw = link_bw(run.hardware, lay, lay.tp)
    full = tokens_per_rank(res, w) * lay.tp * run.model.hidden_size * BF16
    out = TP_COLLECTIVES_PER_LAYER * len(_layers(res, stage)) * ring_s(full, lay.tp, bw)
    if stage == 0 and w.vision:
        patches = w.patches / (lay.dp * microbatches(res))
        out += VIT_ALLREDUCES_PER_BLOCK * run.model.vit.depth * ring_s(2 * patches * run.model.vit.hidden_size * BF16,
                                                                       lay.tp, bw)
    return out


def trainable_split(run: RunConfig, res: Resolved, stage: int, vision: bool) -> tuple[float, float, float, float]:
    """(dense, expert, trainable dense, trainable expert) parameters one rank of `stage` holds (check.memory.params,
    after TP/PP/EP/ETP, before DP sharding); without a ViT its parameters are left out."""
    sp = stage_params(run, res, stage)
    v = run.vision
    vit = (sp.vision + sp.projector) if vision else 0
    t_vit = ((0 if v.freeze_vision_model else sp.vision) + (0 if v.freeze_vision_projection else sp.projector)) \
        if vision else 0
    lm = not v.freeze_language_model
    return (vit + sp.decoder_dense, float(sp.decoder_expert), t_vit + (sp.decoder_dense if lm else 0),
            float(sp.decoder_expert if lm else 0))


def fsdp_bytes(run: RunConfig, res: Resolved, stage: int, vision: bool) -> tuple[float, float]:
    """(dense-DP, expert-DP) bytes Megatron-FSDP moves per micro-batch (optim_grads_params): every unit's BF16
    weights all-gathered before forward and again before backward, and its FP32 gradients reduce-scattered after
    each backward (grads are sharded, so every micro-batch reduces)."""
    if not is_fsdp(run):
        return 0.0, 0.0
    dense, expert, t_dense, t_expert = trainable_split(run, res, stage, vision)
    return 2 * BF16 * dense + GRAD_BYTES * t_dense, 2 * BF16 * expert + GRAD_BYTES * t_expert


def fsdp_s(run: RunConfig, res: Resolved, stage: int, vision: bool) -> float:
    """Megatron-FSDP's collectives of one micro-batch before overlap, over the DP group (dense) and the expert-DP
    group (experts)."""
    lay, hw = res.layout, run.hardware
    dense, expert = fsdp_bytes(run, res, stage, vision)
    return (ring_s(dense, lay.dp, link_bw(hw, lay, lay.tp * lay.cp * lay.dp))
            + ring_s(expert, lay.expert_dp, link_bw(hw, lay, lay.etp * lay.ep * lay.expert_dp)))


def fsdp_units(run: RunConfig, res: Resolved, stage: int) -> int:
    """FSDP units a micro-batch walks through (one per decoder layer and ViT block): the first one's gather has
    nothing to hide behind."""
    return len(_layers(res, stage)) + (run.model.vit.depth if stage == 0 else 0) + 1


def ddp_grad_s(run: RunConfig, res: Resolved, stage: int, vision: bool) -> tuple[float, int]:
    """(seconds, buckets) of the distributed optimizer's gradient reduce-scatter once per step (FP32 grads:
    grad_reduce_in_fp32), dense over DP and experts over expert-DP; 3D layouts only (FSDP reduces per micro-batch)."""
    if is_fsdp(run):
        return 0.0, 1
    lay, hw = res.layout, run.hardware
    _, _, t_dense, t_expert = trainable_split(run, res, stage, vision)
    s = (ring_s(GRAD_BYTES * t_dense, lay.dp, link_bw(hw, lay, lay.tp * lay.cp * lay.dp))
         + ring_s(GRAD_BYTES * t_expert, lay.expert_dp, link_bw(hw, lay, lay.etp * lay.ep * lay.expert_dp)))
    return s, buckets(t_dense + t_expert, lay.dp)


def ddp_gather_s(run: RunConfig, res: Resolved, stage: int, vision: bool) -> float:
    """The distributed optimizer's all-gather of the updated BF16 parameters once per step (3D layouts)."""
    if is_fsdp(run):
        return 0.0
    lay, hw = res.layout, run.hardware
    _, _, t_dense, t_expert = trainable_split(run, res, stage, vision)
    return (ring_s(BF16 * t_dense, lay.dp, link_bw(hw, lay, lay.tp * lay.cp * lay.dp))
            + ring_s(BF16 * t_expert, lay.expert_dp, link_bw(hw, lay, lay.etp * lay.ep * lay.expert_dp)))


def buckets(params: float, dp: int) -> int:
    """DDP buckets of `params` parameters at Megatron's default bucket size."""
    return max(1, math.ceil(params / max(DDP_BUCKET_PARAMS, DDP_BUCKET_PARAMS_PER_DP * dp)))


def p2p_s(run: RunConfig, res: Resolved, w: Workload) -> float:
    """Pipeline sends of one micro-batch on a middle stage: its activations forward and their gradients backward,
    tokens x hidden BF16 (exposed: vlmtrain leaves overlap_p2p_comm off)."""
    lay = res.layout
    if lay.pp <= 1:
        return 0.0
    span = 2 * lay.world_size // lay.pp  # two neighbouring stages
    return 2 * tokens_per_rank(res, w) * run.model.hidden_size * BF16 / link_bw(run.hardware, lay, span)


def optimizer_s(run: RunConfig, res: Resolved, stage: int, vision: bool, cal: Calibration) -> float:
    """Adam's update at the achieved HBM bandwidth: per parameter of the rank's shard, its state read and written,
    the FP32 gradient read (clip, update) and the BF16 weight written; the local gradient buffer zeroed."""
    lay = res.layout
    _, _, t_dense, t_expert = trainable_split(run, res, stage, vision)
    shard = t_dense / lay.dp + t_expert / lay.expert_dp
    local = shard if is_fsdp(run) else t_dense + t_expert
    traffic = shard * (2 * optimizer_bytes(run) + 2 * GRAD_BYTES + BF16) + local * GRAD_BYTES
    return traffic / (run.hardware.hbm_gb_per_s * GB * cal.hbm_fraction)


def host_s(run: RunConfig, res: Resolved, w: Workload, stage: int, cal: Calibration) -> tuple[float, float, float]:
    """(ViT, decoder, outside the towers) host seconds of one micro-batch: per ViT block, per image under Bridge's
    per-image position loop, per decoder layer and Gated-DeltaNet layer, per Megatron-FSDP unit (its hooks). The
    per-block and per-layer constants are a forward and a backward; a tower without backward (frozen, nothing
    trainable before it) launches a third of them, one whose backward is the data gradient only two thirds, and
    full recompute's second forward a third more."""
    lay = res.layout
    vit_b, _, dec_b = flops.backward_factors(run)
    again = 1 / 3 if run.recompute.granularity == Granularity.full else 0.0
    unit = cal.fsdp_unit_host_s if is_fsdp(run) else 0.0
    layers = _layers(res, stage)
    gdn = sum(arch.is_linear_attention(run.model, i) for i in layers)
    decoder = (len(layers) * (cal.layer_host_s + unit) + gdn * cal.gdn_layer_host_s) * ((1 + dec_b) / 3 + again)
    vit = 0.0
    if stage == 0 and w.vision:
        images = w.images / (lay.dp * microbatches(res))
        vit = run.model.vit.depth * (cal.vit_block_host_s + unit) * ((1 + vit_b) / 3 + again * (vit_b > 0))
        vit += images * cal.image_host_s * (run.kernels.vit_positions == "loop")
    return vit, decoder, cal.microbatch_host_s if stage == 0 else 0.0


def exposed_host(host: float, gpu: float, cal: Calibration) -> float:
    """The part of `host` seconds the GPU's `gpu` seconds do not hide."""
    return host - cal.host_hidden * min(host, gpu)
