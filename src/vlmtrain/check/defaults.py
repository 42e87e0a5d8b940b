"""Fast defaults: the `auto` options settled for the world a run is placed on, before preflight.

A user who names only the model, data, hardware and world gets every replacement proven equal for that model
and hardware: the layout measured fastest for the world size, the kernels group's replacements and packing, all
settled here, in check/ (packing needs the memory estimate, the packing proofs and the data's lengths).
Packing keeps what the command trains: train.global_batch_size counts samples unless data.packing is set, so auto
packing turns it into the rows that carry about as many (a row holds at most one GPU's share of a step, and the
data must fill more rows than a step and an evaluation batch take). An unset train.global_batch_size is settled
from the world first: 8 samples per step, raised until every data-parallel rank gets a micro-batch. Every choice
keeps the headroom preflight warns at (memory.TIGHT); where the row alone cannot, exact memory reliefs follow, the
cheapest first (TE's precision-aware Adam, the ViT's unpadded heads, then recompute: selective, the whole MoE
block, full where no trainable tower forbids it). Each value set explicitly wins; each choice is recorded with why
(`Resolved.auto`), which the dry-run plan shows and preflight's `auto_left_off` says for what was left off.
`placed` is the one path train.py, the -m sweeper and the tuner's candidates take.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from vlmtrain.check import memory
from vlmtrain.check.preflight.packing import QWEN35_PACKING_PROVEN, unscanned
from vlmtrain.check.preflight.recompute_graphs import deepstack_blocks_full_recompute
from vlmtrain.config import architecture, world
from vlmtrain.config.compose import CONF_DIR
from vlmtrain.config.groups import cuda_graph, precision
from vlmtrain.config.groups.data import AUTO, validating
from vlmtrain.config.groups.kernels import KernelsConfig
from vlmtrain.config.groups.model import Family
from vlmtrain.config.groups.parallelism import Kind as ParKind
from vlmtrain.config.groups.parallelism import is_fsdp
from vlmtrain.config.groups.recompute import Granularity, RecomputeConfig
from vlmtrain.config.groups.train import UNSET_GLOBAL_BATCH, UNSET_WHY
from vlmtrain.config.resolve import Auto, Resolved, resolve
from vlmtrain.data import prepare

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig

PACK_ROWS = 3
"""Auto packing's largest capacity, in train.seq_length samples: 12288 at seq 4096, the capacity the one-H200 tune and
the 2 x H200 sweep of Qwen3-VL-30B-A3B's shapes measured fastest (experiment=tune_h1, perf_h200x2_best)."""
PACK_STEP = 256
"""Auto packing steps its capacity down by this many tokens until the memory estimate fits with headroom and a row
holds at most one GPU's share of a step."""
SM90 = 9
"""The compute capability every kernels measurement ran on (H100/H200: docs/measurements.md)."""
ANY_GPU = frozenset({"rope", "vit_positions", "pin_visual_inputs", "mask_grid_only"})
"""kernels=fast fields exact on any GPU (tested beside Bridge's code on CPU, or the loader's host work): on off SM90
too."""
VIT_PAD = {72: 128}
"""ViT head dim -> the padded dim measured faster on SM90 (cuDNN at 128: vlmtrain.lab.micro.vit_attention)."""


def placed(run: RunConfig, node_gpus: int, slurm_tasks_per_node: int | None = None) -> tuple[world.Placement, Resolved]:
    """A composed run placed on the world it will run on (world.placement: `run.gpus_per_node` set to it), its
    `auto` options settled there, then resolved."""
    place = world.placement(run, node_gpus, slurm_tasks_per_node)
    run.gpus_per_node = place.gpus_per_node
    return place, settle(run)


def settle(run: RunConfig) -> Resolved:
    """Every `auto` option of `run` settled in place (the layout first: weight-gradient fusion depends on it; then
    the global batch from the layout's DP; then the kernels: the ViT's padded heads cost memory the packing capacity
    must leave room for), then resolved, with what was settled in `Resolved.auto`."""
    picks = _layout(run) + _global_batch(run)
    picks = _fitted(run, picks + _kernels(run, three_d=not is_fsdp(run)))
    return dataclasses.replace(resolve(run), auto=tuple(_one_global_batch(picks)))


def _global_batch(run: RunConfig) -> list[Auto]:
    """An unset train.global_batch_size: UNSET_GLOBAL_BATCH samples per step, raised to the smallest multiple of
    micro_batch_size x DP at or above it, so every data-parallel rank trains at least one micro-batch."""
    t = run.train
    if t.global_batch_size is not None:
        return []
    mbs, dp = t.micro_batch_size, resolve(run).layout.dp
    per = mbs * dp
    if per < 1:  # the layout needs more GPUs than the world has: preflight says which
        t.global_batch_size = UNSET_GLOBAL_BATCH
        return []
    t.global_batch_size = per * -(-UNSET_GLOBAL_BATCH // per)
    raised = "" if t.global_batch_size == UNSET_GLOBAL_BATCH else (
        f", raised to {t.global_batch_size}: the smallest multiple of train.micro_batch_size x DP = {mbs} x {dp} at "
        "or above it, so every data-parallel rank trains at least one micro-batch")
    return [Auto("train.global_batch_size", str(t.global_batch_size),
                 f"{UNSET_WHY}: {UNSET_GLOBAL_BATCH} samples per step{raised}")]


def _one_global_batch(picks: list[Auto]) -> list[Auto]:
    """One train.global_batch_size entry: where auto packing turned the settled samples into rows, the rows, with
    both reasons."""
    gbs = [a for a in picks if a.option == "train.global_batch_size"]
    if len(gbs) < 2:
        return picks
    merged = Auto(gbs[-1].option, gbs[-1].value, f"{gbs[0].why}; {gbs[-1].why}")
    return [merged if a is gbs[-1] else a for a in picks if a is not gbs[0]]


def _fits(run: RunConfig) -> bool:
    """The memory estimate keeps the headroom preflight warns at (memory.TIGHT)."""
    return memory.estimate(run, resolve(run)).total <= memory.TIGHT * run.hardware.memory_gib


def _fitted(run: RunConfig, picks: list[Auto]) -> list[Auto]:
    """`picks` plus packing settled (`_packing`), then, while the memory estimate leaves less headroom than
    preflight warns at (memory.TIGHT), the exact memory reliefs in turn (RELIEFS, cheapest first), packing settled
    again after each. Nothing is relieved where the first settling fits, nor where data.packing was set (the run
    named its row: a preset keeps what it measured, and preflight judges it); where none fits, all are kept and
    preflight judges the estimate (memory_fits names the least world that fits)."""
    gbs, packing = run.train.global_batch_size, run.data.packing
    packed = _packing(run)
    for relieve in RELIEFS if packing == AUTO and not _unplaceable(run) else ():
        if _fits(run):
            break
        if (got := relieve(run, picks)) is not None:
            picks = [a for a in picks if a.option != got.option and not a.option.startswith(got.option + ".")]
            picks.append(got)
            run.data.packing, run.train.global_batch_size = packing, gbs
            packed = _packing(run)
    if run.precision.precision_aware_optimizer is None:
        run.precision.precision_aware_optimizer = False
    run.recompute.auto = False
    return picks + packed


def _unplaceable(run: RunConfig) -> bool:
    """The layout needs more GPUs than the world has (preflight names it): there is nothing to estimate."""
    lay = resolve(run).layout
    return min(lay.dp, lay.expert_dp) < 1


def _tight(run: RunConfig) -> str:
    hw = run.hardware
    return f"the memory estimate leaves less than {1 - memory.TIGHT:.0%} of hardware={hw.name}'s {hw.memory_gib:g} GiB"


def _optimizer_relief(run: RunConfig, picks: list[Auto]) -> Auto | None:
    """TE's precision-aware Adam where it saves memory (3D; BF16 weights keep remainders) and was left unset."""
    p = run.precision
    if p.precision_aware_optimizer is not None or is_fsdp(run) or not memory.keeps_remainders(run):
        return None
    p.precision_aware_optimizer = True
    return Auto("precision.precision_aware_optimizer", "true", f"{_tight(run)} without it: Adam's FP32 master "
                "weights kept as the BF16 weights plus 16-bit remainders (exact), 10 instead of 12 bytes per parameter")


def _unpadded_vit_heads(run: RunConfig, picks: list[Auto]) -> Auto | None:
    """The ViT's attention at its own head dim where kernels=auto padded it (faster, but TE keeps padded tensors)."""
    if not any(a.option == "kernels.vit_attention_head_dim" and a.value != "off" for a in picks):
        return None
    run.kernels.vit_attention_head_dim = None
    return Auto("kernels.vit_attention_head_dim", "off", f"{_tight(run)} with the ViT's attention heads padded "
                "(TE keeps the padded tensors)")


def _recomputed(run: RunConfig, option: str) -> RecomputeConfig | None:
    """recompute=auto set to conf/recompute/<option>.yaml's fields in place (None where the run named its recompute,
    or already runs this much)."""
    r = run.recompute
    if not r.auto or r.granularity == option:
        return None
    chosen = _option(RecomputeConfig, "recompute", option)
    r.granularity, r.modules, r.method, r.num_layers = chosen.granularity, list(chosen.modules), chosen.method, \
        chosen.num_layers
    return r


def _selective_recompute(run: RunConfig, picks: list[Auto]) -> Auto | None:
    """The `selective` option's modules (attention core, MoE activation, layer norms) recomputed in backward."""
    if run.recompute.granularity != Granularity.none or _recomputed(run, "selective") is None:
        return None
    return Auto("recompute", "selective", f"{_tight(run)} without recompute: the selective option's modules "
                f"({', '.join(run.recompute.modules)}) are recomputed in backward (exact; more forward compute)")


def _moe_recompute(run: RunConfig, picks: list[Auto]) -> Auto | None:
    """Selective recompute of the whole MoE block from its input (Megatron's `moe` module, in place of `moe_act`):
    it keeps none of the routed tokens, expert GEMM outputs and probabilities. Not with a router CUDA graph
    (preflight: moe_recompute_with_router_graph)."""
    r = run.recompute
    if (not r.auto or r.granularity != Granularity.selective or "moe" in r.modules or not run.model.num_experts
            or "moe_router" in run.cuda_graph.modules):
        return None
    r.modules = [m for m in r.modules if m != "moe_act"] + ["moe"]
    return Auto("recompute.modules", f"[{','.join(r.modules)}]", f"{_tight(run)} with selective recompute: the "
                "whole MoE block is recomputed from its input (exact; its dispatch and expert GEMMs run again in "
                "backward)")


def _full_recompute(run: RunConfig, picks: list[Auto]) -> Auto | None:
    """Full recompute (each layer keeps only its input), where nothing forbids it: CUDA graphs, or trainable
    deepstack mergers that would get no gradient (the defaults never freeze a tower: vision=frozen_with_projector is
    the user's)."""
    if deepstack_blocks_full_recompute(run) or cuda_graph.enabled(run) or _recomputed(run, "full") is None:
        return None
    return Auto("recompute", "full", f"{_tight(run)} with selective recompute: every decoder layer keeps only its "
                "input and is recomputed in backward (exact; about a third more compute)")


RELIEFS = (_optimizer_relief, _unpadded_vit_heads, _selective_recompute, _moe_recompute, _full_recompute)
"""The exact memory reliefs the defaults try, cheapest first, each only where its option was left to them."""


def _kernels(run: RunConfig, three_d: bool) -> list[Auto]:
    """kernels=auto settled for the model family and hardware, in place (a no-op once settled): each replacement
    is turned on where runs here proved it (the `fast` option's fields on SM90, those exact on any GPU elsewhere;
    experiment=perf_h200_best's three for Qwen3-VL on SM90), a field not at its `default` value is kept as set,
    and each replacement left off is recorded with why. `three_d`: parallelism=3d (weight-gradient fusion ran
    there only)."""
    k, base = run.kernels, KernelsConfig()
    if not k.auto:
        return []
    k.auto = False
    fast = _option(KernelsConfig, "kernels", "fast")
    hw = run.hardware
    sm90, on = hw.sm_major == SM90, f"hardware={hw.name} (SM {hw.sm_major}.{hw.sm_minor})"
    wanted: dict[str, tuple[object, str | None]] = {
        name: (getattr(fast, name), None if sm90 or name in ANY_GPU else f"measured on SM90 (H100/H200) only, not {on}")
        for name in vars(base) if name != "auto" and getattr(fast, name) != getattr(base, name)}
    if "moe_grouped_gemm" in wanted and not sm90:
        wanted["moe_grouped_gemm"] = (fast.moe_grouped_gemm, f"the CUTLASS grouped GEMM is SM90-only, not {on}")
    preset = None if sm90 and run.model.family == Family.qwen3_vl else (
        f"measured with Qwen3-VL on SM90 only (experiment=perf_h200_best), not model={run.model.name} on {on}")
    own = architecture.vit_head_dim(run.model)
    wanted["vit_attention_head_dim"] = (VIT_PAD.get(own), preset or (
        None if own in VIT_PAD else f"padding the ViT's {own}-channel heads was measured faster only from "
        f"{', '.join(map(str, VIT_PAD))} (vlmtrain.lab.micro.vit_attention)"))
    wanted["vit_host_grid"] = (True, preset)
    wanted["wgrad_fusion"] = (True, preset or (None if three_d else "parallelism=fsdp: Megatron-FSDP's fused weight "
                                               "gradients were never run here (preflight: wgrad_fusion_under_fsdp)"))
    out = []
    for name, (value, why_not) in wanted.items():
        if getattr(k, name) != getattr(base, name):
            continue  # set explicitly: kept
        if why_not:
            out.append(Auto(f"kernels.{name}", "off", why_not))
            continue
        setattr(k, name, value)
        why = (f"proven for model={run.model.name} on {on} (docs/measurements.md)" if sm90 else
               "exact on any GPU (tested beside Bridge's code on CPU, or the loader's host work); its speed was "
               f"measured on SM90 (H100/H200) only, not yet on {on}")
        out.append(Auto(f"kernels.{name}", str(value).lower() if isinstance(value, bool) else str(value), why))
    return out


@functools.cache
def _option(schema: type, group: str, name: str) -> Any:
    """conf/<group>/<name>.yaml's fields on the group's schema, read once per process (every run placed settles the
    auto options; read only)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema),
                                               OmegaConf.load(CONF_DIR / group / f"{name}.yaml")))


def _layout(run: RunConfig) -> list[Auto]:
    """parallelism=auto settled for the world size: 3d on one GPU (EP 1, the only degree there), else fsdp."""
    if run.parallelism.kind != ParKind.auto:
        return []
    if run.nodes * world.gpus_per_node(run) == 1:
        run.parallelism.kind = ParKind.three_d
        return [Auto("parallelism", "3d", "one GPU: 3D (EP 1) ran 1.16x Megatron-FSDP's useful tokens/s, measured on "
                     "one H200 with Qwen3-VL-30B-A3B's shapes at 4 layers (results/tune_h200/report.md, layout "
                     "stage)")]
    run.parallelism.kind = ParKind.fsdp
    return [Auto("parallelism", "fsdp", "more than one GPU: Megatron-FSDP, a new run's first layout "
                 "(docs/design.md, FSDP first); parallelism=3d is one override away")]


def packing_off(run: RunConfig) -> str | None:
    """Why auto packing stays off for this run whatever its data, or None where packing is proven and possible."""
    m, hw, t = run.model, run.hardware, run.train
    if _unplaceable(run):
        return "the layout needs more GPUs than the world has (preflight says which)"
    if m.family == Family.qwen35_vl and not QWEN35_PACKING_PROVEN:
        return ("Qwen3.5 packing is not yet proven equal to per-sample training on a GPU (vlmtrain lab "
                "packing-equivalence; check.preflight.packing.QWEN35_PACKING_PROVEN)")
    if hw.sm_major != SM90:
        return (f"packing was proven equal on H200 (SM90) only (vlmtrain.lab.checks.packing_equivalence), not "
                f"hardware={hw.name}")
    if precision.quantized(run):
        return f"packing was proven equal in BF16 only, not precision={run.precision.format}"
    if unscanned(run):
        return f"data={run.data.kind} is not read by the data scan, which packing bins from"
    if t.micro_batch_size != 1:
        return (f"train.micro_batch_size={t.micro_batch_size} asks for padded micro-batches (a packed micro-batch "
                "is one row: train.micro_batch_size=1)")
    if "attn" in run.cuda_graph.modules:
        return "an attention CUDA graph replays fixed sequence boundaries (preflight: packing_with_graphs)"
    if run.data.truncate_long_samples:
        return "data.truncate_long_samples=true: packing never cuts a sample"
    if validating(run) and world.bridge_section(run, "validation").get("eval_global_batch_size"):
        return ("+bridge.validation.eval_global_batch_size counts samples unpacked and rows packed: set "
                "data.packing=<tokens> to pack with it")
    return None


@dataclasses.dataclass(frozen=True)
class Packed:
    """A packed step that trains about the samples the unpacked command would."""

    capacity: int
    rows: int
    """Rows per step: the settled train.global_batch_size."""
    samples: int
    """Training samples in an epoch."""
    bins: int
    """Rows they fill."""

    @property
    def per_row(self) -> float:
        return self.samples / self.bins


def _packing(run: RunConfig) -> list[Auto]:
    """data.packing=auto settled: off where packing_off or the data says why, else `_packed_step`'s row, with
    train.global_batch_size turned from the samples the command asks for into the rows that carry as many."""
    if run.data.packing != AUTO:
        return []
    why = packing_off(run)
    if why is None:
        gbs, hw = run.train.global_batch_size, run.hardware
        got, why = _packed_step(run)
        if got is not None:
            run.data.packing, run.train.global_batch_size = got.capacity, got.rows
            return [Auto("data.packing", str(got.capacity), f"the largest row up to {PACK_ROWS} x train.seq_length "
                         f"that the memory estimate keeps within {memory.TIGHT:.0%} of hardware={hw.name}'s "
                         f"{hw.memory_gib:g} GiB and that holds at most one GPU's share of a step; packing proven "
                         f"equal for model={run.model.name} (results/packing_equivalence.jsonl)"),
                    Auto("train.global_batch_size", str(got.rows), f"{got.rows} packed row(s) of ~{got.per_row:.1f} "
                         f"samples per step: ~{got.rows * got.per_row:.1f} samples, as the command's "
                         f"train.global_batch_size={gbs} samples ({got.samples} samples fill {got.bins} rows); with "
                         "data.packing set it counts rows")]
    run.data.packing = False
    return [Auto("data.packing", "off", why)]


def _packed_step(run: RunConfig) -> tuple[Packed | None, str]:
    """The largest capacity from PACK_ROWS x train.seq_length down to the longest sample (steps of PACK_STEP,
    aligned) whose memory estimate stays within memory.TIGHT of the card and whose every row (the fullest of the
    data stage's bins, not their mean) holds at most one GPU's share of the command's train.global_batch_size
    samples, with the rows per step that carry about as many
    (packed, a step holds whole rows); its epoch and held-out set must fill one step and one evaluation batch of
    rows. (None, why not) where no capacity does."""
    lengths = prepare.lengths(run)
    if lengths is None:
        return None, (f"data={run.data.kind} data.path={run.data.path}: the data stage cannot count its samples' "
                      "lengths before the run (it names what is wrong when the run starts)")
    t, hw = run.train, run.hardware
    n, gbs = len(lengths.train), t.global_batch_size
    if n < gbs:  # unpacked too: preflight's data_fills_global_batch warns of it
        return None, f"the {n} training samples are fewer than one step's train.global_batch_size={gbs}"
    if 0 < len(lengths.held_out) < gbs:  # unpacked too: preflight's validation_fills_eval_batch refuses it
        return None, f"the {len(lengths.held_out)} held-out samples are fewer than one evaluation batch of {gbs}"
    if lengths.longest > PACK_ROWS * t.seq_length:
        return None, (f"the longest sample ({lengths.longest} tokens) is longer than auto packing's largest row "
                      f"({PACK_ROWS} x train.seq_length={t.seq_length})")
    run.data.packing = t.seq_length  # the layout and segment alignment of a packed run
    res = resolve(run)
    dp, align = res.layout.dp, res.pack_align
    step, share = math.lcm(PACK_STEP, align), gbs / dp
    why = (f"the memory estimate fits no packed row within {memory.TIGHT:.0%} of hardware={hw.name}'s "
           f"{hw.memory_gib:g} GiB")
    for cap in range(PACK_ROWS * t.seq_length // step * step, -(-lengths.longest // step) * step - 1, -step):
        run.data.packing = cap
        if memory.estimate(run, resolve(run)).total > memory.TIGHT * hw.memory_gib:
            continue
        train_rows, held_rows = lengths.rows(cap, align)
        per_row = n / train_rows
        rows = dp * int(share / per_row + 0.5)
        if (fullest := lengths.fullest(cap, align)) > share:
            why = (f"train.global_batch_size={gbs} over DP {dp} is {share:g} sample(s) per GPU per step, fewer than "
                   f"a packed row holds even at the smallest capacity (its fullest: {fullest}): packing would change "
                   "the samples a step trains")
        elif train_rows < rows or (train_rows == rows and n > gbs):
            why = (f"the {n} training samples fill {train_rows} packed rows, no more than one step's {rows}: every "
                   "step would train the same rows")
        elif lengths.held_out and held_rows < rows:
            why = (f"the {len(lengths.held_out)} held-out samples fill {held_rows} packed rows, fewer than one "
                   f"evaluation batch of {rows}")
        else:
            return Packed(cap, rows, n, train_rows), ""
    return None, why
