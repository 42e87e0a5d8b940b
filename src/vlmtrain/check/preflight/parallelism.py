"""Preflight rules: the parallel layout (FSDP vs PP, divisibility of experts, heads, layers, world and batch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlmtrain.check.preflight.registry import Severity, bridge, rule
from vlmtrain.config import world
from vlmtrain.config.groups.parallelism import is_fsdp
from vlmtrain.config.groups.train import global_batch_size

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


@rule(Severity.error)
def fsdp_needs_pp1(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
    if is_fsdp(run) and lay.pp > 1:
        return (f"parallelism=fsdp with parallelism.pp={lay.pp}: Megatron-FSDP does not support pipeline parallelism "
                "(Bridge validates it but it fails in practice). Use parallelism.pp=1 or parallelism=3d.")
    return None


@rule(Severity.error)
def fsdp_checkpoint_format(run: RunConfig, res: Resolved) -> str | None:
    fmt = bridge(run, "checkpoint", "ckpt_format")
    if is_fsdp(run) and fmt not in (None, "fsdp_dtensor"):
        return (f"parallelism=fsdp needs checkpoint.ckpt_format=fsdp_dtensor; +bridge.checkpoint.ckpt_format={fmt} "
                "given.")
    return None


@rule(Severity.error)
def ep_divides_experts(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
    if run.model.num_experts % lay.ep:
        return (f"parallelism.ep={lay.ep} does not divide model={run.model.name}'s {run.model.num_experts} experts. "
                f"Use a divisor of {run.model.num_experts}.")
    return None


@rule(Severity.error)
def tp_divides_kv_heads(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
    if run.model.num_query_groups % lay.tp:
        return (f"parallelism.tp={lay.tp} does not divide model={run.model.name}'s {run.model.num_query_groups} KV "
                f"heads. Use parallelism.tp in {[d for d in range(1, 9) if run.model.num_query_groups % d == 0]}.")
    return None


@rule(Severity.error)
def pipeline_split(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
    if lay.pp == 1:
        return None
    middle, rest = world.shared_stages(run, lay)
    if middle and rest % middle:
        return (f"parallelism.pp={lay.pp}: {rest} decoder layers do not split evenly over {middle} stages "
                "(model.num_layers, parallelism.first_stage_layers/last_stage_layers).")
    return None


@rule(Severity.error)
def vpp_divides_stage_layers(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
    if not lay.vpp or lay.vpp == 1:
        return None
    bad = [x for x in res.stage_sizes if x % lay.vpp]
    if lay.pp == 1:
        return "parallelism.vpp needs parallelism.pp>1."
    if bad:
        return (f"parallelism.vpp={lay.vpp} does not divide the layers per pipeline stage {res.stage_sizes} "
                "(Megatron asserts at model build). Change parallelism.vpp or model.num_layers.")
    return None


@rule(Severity.error)
def deepstack_on_first_stage(run: RunConfig, res: Resolved) -> str | None:
    """Bridge's Qwen3-VL block adds deepstack feature i to decoder layer i and asserts that stage 0 has them all."""
    lay = res.layout
    ds = run.model.vit.deepstack_indexes
    first = res.stage_sizes[0]
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
def world_layout(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
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
def partial_nodes(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
    if lay.nodes > 1 and lay.gpus_per_node < run.hardware.gpus_per_node:
        return (f"nodes={lay.nodes} with gpus_per_node={lay.gpus_per_node} leaves GPUs of each {run.hardware.name} "
                "node idle.")
    return None


@rule(Severity.error)
def profile_step_in_run(run: RunConfig, res: Resolved) -> str | None:
    step, iters = run.train.profile_step, run.train.iterations
    # Bridge starts recording at profile_step and writes the trace when the loop reaches profile_step + 1, so one
    # more iteration must follow (vlmtrain.lab.profile_step's proven setting: step 5 of 7)
    if step is not None and not 1 <= step <= iters - 2:
        return (f"train.profile_step={step} leaves no room in this run (train.iterations={iters}): Bridge would "
                f"write no trace. Set 1 <= train.profile_step <= train.iterations - 2, after warm-up, e.g. "
                f"train.profile_step={min(5, max(iters - 2, 1))} (or more train.iterations).")
    return None


@rule(Severity.error)
def global_batch_divisible(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
    t, gbs = run.train, global_batch_size(run)
    if gbs % (t.micro_batch_size * lay.dp):
        return (f"train.global_batch_size={gbs} is not a multiple of micro_batch_size x DP = "
                f"{t.micro_batch_size} x {lay.dp}. Use train.global_batch_size="
                f"{max(1, round(gbs / (t.micro_batch_size * lay.dp))) * t.micro_batch_size * lay.dp}, or leave it "
                "unset: the defaults settle it from the world.")
    return None


@rule(Severity.error)
def context_parallel_seq(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
    if lay.cp > 1 and run.train.seq_length % (2 * lay.cp):
        return f"parallelism.cp={lay.cp} needs train.seq_length divisible by {2 * lay.cp}."
    return None


@rule(Severity.warning)
def etp_while_ep_fits(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
    wider = lay.ep * lay.etp
    if lay.etp > 1 and run.model.num_experts % wider == 0:
        return (f"parallelism.etp={lay.etp}: EP alone fits ({run.model.num_experts} experts divide by {wider}). "
                "ETP adds communication and tuning surface; use it only when EP is not enough: try "
                f"parallelism.ep={wider} parallelism.etp=1.")
    return None
