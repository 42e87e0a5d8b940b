"""Check: cross-group rules that stop bad combinations before they reach a cluster.

Bridge validates only when ranks start, lets some settings fall back silently and accepts layouts that fail
later (FSDP with PP, VPP not dividing the layers). Each rule below encodes one line of the seed's
Compatibility table or Pitfalls, or a Bridge/Megatron assert that would otherwise fire on the cluster. Rules
never mutate; each message names the groups involved and the override that fixes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from vlmtrain.check import memory
from vlmtrain.config import world
from vlmtrain.config.groups import cuda_graph, precision
from vlmtrain.config.groups.data import Kind as DataKind
from vlmtrain.config.groups.dispatcher import Backend
from vlmtrain.config.groups.kernels import GroupedGemm
from vlmtrain.config.groups.model import Family
from vlmtrain.config.groups.parallelism import Kind as ParKind
from vlmtrain.config.groups.precision import Format, Scaling, VisionPrecision
from vlmtrain.config.groups.recompute import Granularity

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.config.world import Layout


class Severity(StrEnum):
    error = "error"
    warning = "warning"


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    message: str

    def __str__(self) -> str:
        return f"[{self.severity}] {self.rule}: {self.message}"


class PreflightError(ValueError):
    """Raised when a run has error findings; the message lists every one of them."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__("preflight failed:\n" + "\n".join(f"  {f}" for f in findings))


Rule = Callable[["RunConfig", "Layout"], str | None]
RULES: list[tuple[Severity, Rule]] = []


def rule(severity: Severity) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES.append((severity, fn))
        return fn

    return register


def _bridge(run: RunConfig, section: str, key: str) -> object:
    return (run.bridge.get(section) or {}).get(key) if isinstance(run.bridge.get(section), dict) else None


# --- dispatcher x hardware ---------------------------------------------------------------------------------


@rule(Severity.error)
def hybridep_topology(run: RunConfig, lay: Layout) -> str | None:
    if run.dispatcher.backend != Backend.hybridep:
        return None
    hw = run.hardware
    if hw.sm_major not in (8, 9, 10):
        return (f"dispatcher=hybridep needs SM 8.x/9.x/10.x; hardware={hw.name} is SM {hw.sm_major}. "
                "Use dispatcher=alltoall.")
    forced = _bridge(run, "model", "moe_token_dispatcher_type")
    if forced not in (None, "flex"):
        return (f"dispatcher=hybridep needs the flex dispatcher; +bridge.model.moe_token_dispatcher_type={forced} "
                "overrides it.")
    if hw.mnnvl and lay.ep > hw.nvlink_domain_size:
        return (f"dispatcher=hybridep on hardware={hw.name}: EP={lay.ep} exceeds the {hw.nvlink_domain_size}-GPU "
                f"NVLink domain. Use parallelism.ep<={hw.nvlink_domain_size}.")
    return None


@rule(Severity.warning)
def hybridep_crosses_nodes(run: RunConfig, lay: Layout) -> str | None:
    hw = run.hardware
    if run.dispatcher.backend == Backend.hybridep and not hw.mnnvl and lay.ep > hw.nvlink_domain_size:
        return (f"dispatcher=hybridep on hardware={hw.name}: EP={lay.ep} spans {lay.ep // hw.nvlink_domain_size} "
                f"NVLink domains of {hw.nvlink_domain_size}; tokens cross nodes over the network.")
    return None


@rule(Severity.error)
def deepep_not_on_gb200(run: RunConfig, lay: Layout) -> str | None:
    hw = run.hardware
    if run.dispatcher.backend == Backend.deepep and hw.sm_major == 10 and not hw.device_name.startswith(
        ("NVIDIA B200", "NVIDIA B300")
    ):
        return f"dispatcher=deepep is not supported on hardware={hw.name} (Bridge rejects it). Use dispatcher=hybridep."
    if run.dispatcher.backend == Backend.deepep and hw.sm_major not in (8, 9, 10):
        return f"dispatcher=deepep needs SM 8.x/9.x or B200; hardware={hw.name}. Use dispatcher=alltoall."
    return None


@rule(Severity.error)
def cutlass_grouped_gemm_needs_sm90(run: RunConfig, lay: Layout) -> str | None:
    hw = run.hardware
    if run.kernels.moe_grouped_gemm == GroupedGemm.cutlass and hw.sm_major != 9:
        return (f"kernels.moe_grouped_gemm=cutlass: Transformer Engine's CUTLASS grouped GEMM is SM90-only, and "
                f"hardware={hw.name} is SM {hw.sm_major}.{hw.sm_minor} (TE would silently fall back). Use "
                "kernels.moe_grouped_gemm=multistream (or kernels=default).")
    return None


# --- parallelism -------------------------------------------------------------------------------------------


@rule(Severity.error)
def fsdp_needs_pp1(run: RunConfig, lay: Layout) -> str | None:
    if run.parallelism.kind == ParKind.fsdp and lay.pp > 1:
        return (f"parallelism=fsdp with parallelism.pp={lay.pp}: Megatron-FSDP does not support pipeline parallelism "
                "(Bridge validates it but it fails in practice). Use parallelism.pp=1 or parallelism=3d.")
    return None


@rule(Severity.error)
def fsdp_checkpoint_format(run: RunConfig, lay: Layout) -> str | None:
    fmt = _bridge(run, "checkpoint", "ckpt_format")
    if run.parallelism.kind == ParKind.fsdp and fmt not in (None, "fsdp_dtensor"):
        return (f"parallelism=fsdp needs checkpoint.ckpt_format=fsdp_dtensor; +bridge.checkpoint.ckpt_format={fmt} "
                "given.")
    return None


@rule(Severity.error)
def ep_divides_experts(run: RunConfig, lay: Layout) -> str | None:
    if run.model.num_experts % lay.ep:
        return (f"parallelism.ep={lay.ep} does not divide model={run.model.name}'s {run.model.num_experts} experts. "
                f"Use a divisor of {run.model.num_experts}.")
    return None


@rule(Severity.error)
def tp_divides_kv_heads(run: RunConfig, lay: Layout) -> str | None:
    if run.model.num_query_groups % lay.tp:
        return (f"parallelism.tp={lay.tp} does not divide model={run.model.name}'s {run.model.num_query_groups} KV "
                f"heads. Use parallelism.tp in {[d for d in range(1, 9) if run.model.num_query_groups % d == 0]}.")
    return None


def _stage_layers(run: RunConfig, lay: Layout) -> list[int]:
    """Decoder layers per pipeline stage."""
    return [len(layers) for layers in world.stage_layers(run, lay)]


@rule(Severity.error)
def pipeline_split(run: RunConfig, lay: Layout) -> str | None:
    if lay.pp == 1:
        return None
    middle, rest = world.shared_stages(run, lay)
    if middle and rest % middle:
        return (f"parallelism.pp={lay.pp}: {rest} decoder layers do not split evenly over {middle} stages "
                "(model.num_layers, parallelism.first_stage_layers/last_stage_layers).")
    return None


@rule(Severity.error)
def vpp_divides_stage_layers(run: RunConfig, lay: Layout) -> str | None:
    if not lay.vpp or lay.vpp == 1:
        return None
    bad = [x for x in _stage_layers(run, lay) if x % lay.vpp]
    if lay.pp == 1:
        return "parallelism.vpp needs parallelism.pp>1."
    if bad:
        return (f"parallelism.vpp={lay.vpp} does not divide the layers per pipeline stage {_stage_layers(run, lay)} "
                "(Megatron asserts at model build). Change parallelism.vpp or model.num_layers.")
    return None


@rule(Severity.error)
def deepstack_on_first_stage(run: RunConfig, lay: Layout) -> str | None:
    """Bridge's Qwen3-VL block adds deepstack feature i to decoder layer i and asserts that stage 0 has them all."""
    ds = run.model.vit.deepstack_indexes
    first = _stage_layers(run, lay)[0]
    if len(ds) <= first:
        return None
    if lay.pp == 1:
        kept = ",".join(map(str, ds[:first]))
        return (f"model={run.model.name} feeds {len(ds)} deepstack features into its first {len(ds)} decoder layers, "
                f"but model.num_layers={first} (Bridge asserts at the first forward). Use model.num_layers>={len(ds)}, "
                f"or keep one deepstack merger per layer: model.vit.deepstack_indexes=[{kept}] (every layer keeps "
                "its published shape).")
    return (f"model={run.model.name} feeds {len(ds)} deepstack layers into PP stage 0, which holds {first} decoder "
            f"layers. Raise parallelism.first_stage_layers to >= {len(ds)} or lower parallelism.pp.")


@rule(Severity.error)
def world_layout(run: RunConfig, lay: Layout) -> str | None:
    w = lay.world_size
    if w % (lay.tp * lay.pp * lay.cp):
        return (f"world size {w} is not divisible by TP*PP*CP={lay.tp * lay.pp * lay.cp} (parallelism.*, nodes, "
                "gpus_per_node).")
    if w % (lay.etp * lay.ep * lay.pp):
        return f"world size {w} is not divisible by ETP*EP*PP={lay.etp * lay.ep * lay.pp} (parallelism.ep/etp/pp)."
    if lay.gpus_per_node > run.hardware.gpus_per_node:
        return (f"gpus_per_node={lay.gpus_per_node} exceeds hardware={run.hardware.name}'s "
                f"{run.hardware.gpus_per_node} GPUs per node.")
    return None


@rule(Severity.warning)
def partial_nodes(run: RunConfig, lay: Layout) -> str | None:
    if lay.nodes > 1 and lay.gpus_per_node < run.hardware.gpus_per_node:
        return (f"nodes={lay.nodes} with gpus_per_node={lay.gpus_per_node} leaves GPUs of each {run.hardware.name} "
                "node idle.")
    return None


@rule(Severity.error)
def profile_step_in_run(run: RunConfig, lay: Layout) -> str | None:
    step, iters = run.train.profile_step, run.train.iterations
    # Bridge starts recording at profile_step and writes the trace when the loop reaches profile_step + 1, so one
    # more iteration must follow (benchmarks/profile_step.py's proven setting: step 5 of 7)
    if step is not None and not 1 <= step <= iters - 2:
        return (f"train.profile_step={step} leaves no room in this run (train.iterations={iters}): Bridge would "
                f"write no trace. Set 1 <= train.profile_step <= train.iterations - 2, after warm-up, e.g. "
                f"train.profile_step={min(5, max(iters - 2, 1))} (or more train.iterations).")
    return None


@rule(Severity.error)
def global_batch_divisible(run: RunConfig, lay: Layout) -> str | None:
    t = run.train
    if t.global_batch_size % (t.micro_batch_size * lay.dp):
        return (f"train.global_batch_size={t.global_batch_size} is not a multiple of micro_batch_size x DP = "
                f"{t.micro_batch_size} x {lay.dp}. Use train.global_batch_size="
                f"{max(1, round(t.global_batch_size / (t.micro_batch_size * lay.dp))) * t.micro_batch_size * lay.dp}.")
    return None


@rule(Severity.error)
def context_parallel_seq(run: RunConfig, lay: Layout) -> str | None:
    if lay.cp > 1 and run.train.seq_length % (2 * lay.cp):
        return f"parallelism.cp={lay.cp} needs train.seq_length divisible by {2 * lay.cp}."
    return None


@rule(Severity.warning)
def etp_while_ep_fits(run: RunConfig, lay: Layout) -> str | None:
    wider = lay.ep * lay.etp
    if lay.etp > 1 and run.model.num_experts % wider == 0:
        return (f"parallelism.etp={lay.etp}: EP alone fits ({run.model.num_experts} experts divide by {wider}). "
                "ETP adds communication and tuning surface; the seed uses it only when EP is not enough: try "
                f"parallelism.ep={wider} parallelism.etp=1.")
    return None


# --- recompute x cuda_graph --------------------------------------------------------------------------------


@rule(Severity.error)
def graphs_with_full_recompute(run: RunConfig, lay: Layout) -> str | None:
    if run.cuda_graph.modules and run.recompute.granularity == Granularity.full:
        return ("cuda_graph with recompute=full: TE CUDA graphs assert with full recompute. Use recompute=selective "
                "or cuda_graph=none.")
    return None


@rule(Severity.error)
def deepstack_full_recompute(run: RunConfig, lay: Layout) -> str | None:
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
def moe_preprocess_needs_router(run: RunConfig, lay: Layout) -> str | None:
    mods = run.cuda_graph.modules
    if "moe_preprocess" in mods and "moe_router" not in mods:
        return "cuda_graph scope moe_preprocess needs moe_router in cuda_graph.modules."
    return None


@rule(Severity.error)
def moe_recompute_with_router_graph(run: RunConfig, lay: Layout) -> str | None:
    if (run.recompute.granularity == Granularity.selective and "moe" in run.recompute.modules
            and "moe_router" in run.cuda_graph.modules):
        return ("recompute.modules contains moe while cuda_graph captures moe_router (Megatron asserts). Drop moe from "
                "recompute.modules or use cuda_graph=none.")
    return None


@rule(Severity.error)
def qwen3_vl_no_attn_graph(run: RunConfig, lay: Layout) -> str | None:
    if run.model.family == Family.qwen3_vl and "attn" in run.cuda_graph.modules:
        return (f"model={run.model.name} with an attn CUDA-graph scope: Qwen3VLModel cannot capture attention. "
                "Use cuda_graph=moe_router_preprocess.")
    return None


@rule(Severity.error)
def packing_with_graphs(run: RunConfig, lay: Layout) -> str | None:
    if run.cuda_graph.modules and run.data.packing:
        return (f"cuda_graph={run.choices.get('cuda_graph', 'custom')} with data.packing=true: a packed micro-batch is "
                "as long as its samples, and CUDA graphs replay one static shape (Bridge's Qwen3.5-VL recipes "
                "disable graphs for packing too). Use cuda_graph=none, or data.packing=false (graphs then pad every "
                "sample to train.seq_length).")
    return None


@rule(Severity.error)
def packing_needs_two_samples(run: RunConfig, lay: Layout) -> str | None:
    if run.data.packing and run.train.micro_batch_size < 2:
        return ("data.packing=true with train.micro_batch_size=1: in-batch packing joins the samples of one "
                "micro-batch, and Bridge refuses it for a single sample. Raise train.micro_batch_size (same "
                "train.global_batch_size: fewer accumulation steps).")
    return None


@rule(Severity.error)
def qwen35_packing_unverified(run: RunConfig, lay: Layout) -> str | None:
    """Qwen3.5 packs through code no run here has executed; kernels=fast adds none (its replacements are the same
    Qwen3-VL ViT and pinned-pixel paths, and its decoder RoPE replacement only runs on packed rows)."""
    if run.model.family == Family.qwen35_vl and run.data.packing:
        return (f"model={run.model.name} with data.packing=true is unverified: packed (THD) rows take Megatron's "
                "GatedDeltaNet varlen branch (cu_seqlens into FLA's causal conv and chunked delta rule; on Hopper "
                "TileLang's varlen backward) and TE's fused RoPE on the partial (64 of 256) rotary dims under "
                "kernels=fast. The code supports both, but no GPU run has checked them and Bridge's own Qwen3.5-VL "
                "recipes never pack. Use data.packing=false, or preflight.ignore=[qwen35_packing_unverified] to run "
                "it as that check.")
    return None


@rule(Severity.error)
def a2a_overlap_with_qwen_vl(run: RunConfig, lay: Layout) -> str | None:
    if _bridge(run, "comm_overlap", "overlap_moe_expert_parallel_comm"):
        return ("+bridge.comm_overlap.overlap_moe_expert_parallel_comm: MoE A2A overlap is not supported by the "
                "Qwen-VL forward step (Qwen3VLModel has no build_schedule_plan). Remove it.")
    return None


# --- data and comparisons ----------------------------------------------------------------------------------


@rule(Severity.error)
def seq_fits_images(run: RunConfig, lay: Layout) -> str | None:
    d = run.data
    if d.kind == DataKind.realistic:
        worst = d.payload.image_tokens_max * (len(d.payload.images_per_sample) - 1)
        if worst >= run.train.seq_length:
            return (f"data=realistic can put {worst} image tokens in one sample, more than train.seq_length="
                    f"{run.train.seq_length}. Raise train.seq_length or lower data.payload.image_tokens_max.")
    if d.kind == DataKind.mock:
        tokens = (d.mock_image_size[0] // 32 + 1) * (d.mock_image_size[1] // 32 + 1) * d.mock_num_images
        if tokens >= run.train.seq_length:
            return f"data=mock images need ~{tokens} tokens, more than train.seq_length={run.train.seq_length}."
    return None


@rule(Severity.error)
def data_path_exists(run: RunConfig, lay: Layout) -> str | None:
    d = run.data
    local = d.kind in (DataKind.jsonl, DataKind.parquet, DataKind.energon)
    if local and not (d.path and Path(d.path).expanduser().exists()):
        return f"data={d.kind}: data.path={d.path} does not exist. Point data.path at your {d.kind} data."
    if d.kind == DataKind.jsonl and d.image_dir and not Path(d.image_dir).expanduser().is_dir():
        return f"data=jsonl: data.image_dir={d.image_dir} is not a directory."
    return None


@rule(Severity.warning)
def mock_is_not_performance(run: RunConfig, lay: Layout) -> str | None:
    if run.data.kind == DataKind.mock:
        return ("data=mock: NOT a performance run. Mock VLM data looks ~2x faster than real images (seed); use "
                "data=realistic or your own data before drawing throughput conclusions.")
    return None


@rule(Severity.warning)
def frozen_vision_benchmark_only(run: RunConfig, lay: Layout) -> str | None:
    if run.vision.freeze_vision_model:
        return (f"vision={run.choices.get('vision', 'frozen')}: frozen-vision throughput is benchmark-only; compare it "
                "with frozen runs, never with vision=trainable runs.")
    return None


# --- precision x hardware, data, layout, graphs ----------------------------------------------------------


@rule(Severity.error)
def precision_needs_hardware(run: RunConfig, lay: Layout) -> str | None:
    hw, fmt = run.hardware, run.precision.format
    if precision.sm(hw) >= precision.MIN_SM[fmt]:
        return None
    fix = "precision=fp8 (or precision=bf16)" if precision.sm(hw) >= precision.MIN_SM[Format.fp8] else "precision=bf16"
    return (f"precision={fmt} needs SM {precision.MIN_SM[fmt] / 10:.1f}+ tensor cores; hardware={hw.name} is SM "
            f"{hw.sm_major}.{hw.sm_minor} (Transformer Engine refuses the recipe when the model is built). Use {fix}.")


@rule(Severity.warning)
def fp8_blockwise_off_hopper(run: RunConfig, lay: Layout) -> str | None:
    p, hw = run.precision, run.hardware
    if p.format == Format.fp8 and p.scaling == Scaling.blockwise and hw.sm_major != 9:
        return (f"precision.scaling=blockwise is documented by Bridge as Hopper-only; hardware={hw.name} is SM "
                f"{hw.sm_major}.{hw.sm_minor}. On Blackwell use precision=mxfp8 (hardware block scaling).")
    return None


@rule(Severity.error)
def fp8_delayed_with_bf16_layers(run: RunConfig, lay: Layout) -> str | None:
    p = run.precision
    if p.format == Format.fp8 and p.scaling == Scaling.delayed and any(precision.bf16_layers(run)):
        return ("precision.scaling=delayed cannot keep decoder layers in BF16 (Megatron asserts: delayed scaling "
                "wraps the whole block in one FP8 context). Set precision.bf16_layers_at_start=0 "
                "precision.bf16_layers_at_end=0, or precision.scaling=tensorwise.")
    return None


@rule(Severity.error)
def bf16_layers_fit_each_stage(run: RunConfig, lay: Layout) -> str | None:
    kept = sum(precision.bf16_layers(run))
    if kept and kept >= min(_stage_layers(run, lay)):
        return (f"precision={precision.label(run)} keeps {kept} decoder layers per pipeline stage in BF16 "
                f"(precision.bf16_layers_at_start/_end, or the Bridge recipe's own), leaving no quantized layer in a "
                f"stage of {min(_stage_layers(run, lay))}. Set precision.bf16_layers_at_start=0 "
                "precision.bf16_layers_at_end=0, or use precision=bf16.")
    return None


@rule(Severity.error)
def quantized_packing_alignment(run: RunConfig, lay: Layout) -> str | None:
    if precision.quantized(run) and run.data.packing:
        return (f"precision={run.precision.format} with data.packing=true: Bridge resets a packed row's pad multiple "
                "to the CP/SP one (training/config.py: in_batch_packing_pad_to_multiple_of), so the row's token count "
                "is not a multiple of 16 (32 for MXFP8/NVFP4) and TE's quantized GEMMs assert on it. Use "
                "data.packing=false (each sample pads to a multiple of 128 tokens).")
    return None


@rule(Severity.warning)
def quantized_unmeasured_combination(run: RunConfig, lay: Layout) -> str | None:
    if not precision.quantized(run):
        return None
    combos = [what for what, on in (
        ("cuda_graph (TE keeps FP8 scaling state inside captured graphs)", cuda_graph.enabled(run)),
        ("kernels.moe_grouped_gemm=cutlass (TE's CUTLASS grouped GEMM was measured in BF16 only)",
         run.kernels.moe_grouped_gemm == GroupedGemm.cutlass),
        ("vision=quantized on a frozen ViT (no backward to speed up there)",
         run.precision.vision == VisionPrecision.quantized and run.vision.freeze_vision_model),
    ) if on]
    if combos:
        return (f"precision={precision.label(run)} with " + "; ".join(combos) + ": no vlmtrain run has measured this "
                "combination (results/precision_h200.jsonl); check loss parity against precision=bf16.")
    return None


# --- memory -----------------------------------------------------------------------------------------------


def _memory_verdict(run: RunConfig, lay: Layout) -> tuple[memory.MemoryBreakdown, float]:
    """(estimate, fraction of the hardware group's memory_gib): pure arithmetic, no Bridge import."""
    b = memory.estimate(run)
    return b, b.total / run.hardware.memory_gib


def _memory_message(run: RunConfig, lay: Layout, b: memory.MemoryBreakdown, verdict: str) -> str:
    c = run.choices
    fewer = "recompute=full"
    if deepstack_blocks_full_recompute(run):
        fewer = ("recompute=selective, recompute=full with vision=frozen_with_projector (full recompute alone leaves "
                 "the trainable deepstack mergers without gradient)")
    top = sorted(b.items().items(), key=lambda kv: -kv[1])[:3]
    state = b.params + b.grads + b.optimizer
    hints = (f" Model state alone (params+grads+optimizer) is {state:.0f} GiB: shard the model further "
             "(parallelism.ep/pp, parallelism=fsdp) before touching activations." if state > run.hardware.memory_gib
             else "")
    if run.data.packing:
        hints += (" With data.packing this bounds every sample by train.seq_length tokens; a packed micro-batch "
                  "holds only its samples' real tokens, so shorter data peaks lower: a short run measures it "
                  "(peak_mem_gib), and preflight.ignore=[memory_fits] accepts that measurement over this bound.")
    return (f"model={run.model.name} {verdict}: estimated {b.total:.0f} GiB per GPU (PP stage {b.stage}; largest: "
            + ", ".join(f"{k} {v:.0f}" for k, v in top)
            + f") vs hardware={run.hardware.name} memory_gib={run.hardware.memory_gib:.0f}, with "
            f"parallelism={c.get('parallelism', run.parallelism.kind)} (EP {lay.ep}, DP {lay.dp}), "
            f"recompute={c.get('recompute', run.recompute.granularity)}, "
            f"train.micro_batch_size={run.train.micro_batch_size}, seq {b.seq_len}. Try {fewer}, a larger "
            "parallelism.ep (more nodes once EP spans all GPUs) or a smaller train.micro_batch_size." + hints)


@rule(Severity.error)
def memory_fits(run: RunConfig, lay: Layout) -> str | None:
    b, frac = _memory_verdict(run, lay)
    return _memory_message(run, lay, b, "does not fit") if frac > 1.0 else None


@rule(Severity.warning)
def memory_headroom(run: RunConfig, lay: Layout) -> str | None:
    b, frac = _memory_verdict(run, lay)
    return _memory_message(run, lay, b, f"is tight ({frac:.0%})") if 0.9 < frac <= 1.0 else None


def check(run: RunConfig) -> list[Finding]:
    """Every finding for this run; rules named in preflight.ignore are downgraded to warnings."""
    lay = world.layout(run)
    out = []
    for severity, fn in RULES:
        msg = fn(run, lay)
        if msg:
            sev = Severity.warning if fn.__name__ in run.preflight.ignore else severity
            out.append(Finding(fn.__name__, sev, msg))
    return out


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == Severity.error]


def enforce(run: RunConfig) -> list[Finding]:
    """Raise PreflightError on any error; return the warnings."""
    findings = check(run)
    if errors(findings):
        raise PreflightError(errors(findings))
    return findings
