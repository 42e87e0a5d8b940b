"""Preflight rules: the per-GPU memory estimate (check.memory) against the hardware group's memory_gib."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from vlmtrain.check import memory
from vlmtrain.check.preflight.recompute_graphs import deepstack_blocks_full_recompute
from vlmtrain.check.preflight.registry import Severity, bridge, rule
from vlmtrain.config import world
from vlmtrain.config.groups.parallelism import is_fsdp
from vlmtrain.config.groups.recompute import Granularity
from vlmtrain.config.resolve import resolve

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


def _memory_verdict(run: RunConfig, res: Resolved) -> tuple[memory.MemoryBreakdown, float]:
    """(estimate, fraction of the hardware group's memory_gib): pure arithmetic, no Bridge import."""
    b = memory.estimate(run, res)
    return b, b.total / run.hardware.memory_gib


MAX_NODES = 256
"""How far the memory refusal looks for the least world of the run's hardware that fits."""


def least_world(run: RunConfig, res: Resolved) -> world.Layout | None:
    """The smallest world of the run's hardware (more GPUs on its one node, then more full nodes) whose layout is
    valid and whose memory estimate fits memory_gib with every other setting as it is; None up to MAX_NODES."""
    lay, gpn = res.layout, run.hardware.gpus_per_node
    worlds = [(1, g) for g in range(lay.gpus_per_node + 1, gpn + 1)] if lay.nodes == 1 else []
    worlds += [(n, gpn) for n in range(max(lay.nodes + 1, 2), MAX_NODES + 1)]
    for nodes, gpus in worlds:
        trial = dataclasses.replace(run, nodes=nodes, gpus_per_node=gpus)
        got = resolve(trial)
        bigger = got.layout
        if (min(bigger.dp, bigger.expert_dp) < 1 or bigger.world_size % (bigger.tp * bigger.pp * bigger.cp)
                or bigger.world_size % (bigger.etp * bigger.ep * bigger.pp)):
            continue
        if memory.estimate(trial, got).total <= run.hardware.memory_gib:
            return bigger
    return None


def recompute_text(run: RunConfig) -> str:
    """The recompute in effect, as an override would name it (recompute=auto: what the defaults settled)."""
    r = run.recompute
    if r.granularity == Granularity.selective:
        return f"recompute=selective ({', '.join(r.modules)})"
    return f"recompute={r.granularity}"


def _less_activation(run: RunConfig) -> list[str]:
    """The recompute steps beyond the one in effect that this run may take (none where CUDA graphs forbid them)."""
    r, graphs = run.recompute, run.cuda_graph.modules
    tries = []
    if r.granularity == Granularity.none:
        tries.append("recompute=selective")
    if (r.granularity != Granularity.full and "moe" not in r.modules and run.model.num_experts
            and "moe_router" not in graphs):
        modules = [m for m in (r.modules or ["core_attn", "moe_act", "layernorm"]) if m != "moe_act"] + ["moe"]
        tries.append(f"recompute=selective recompute.modules=[{','.join(modules)}] (the whole MoE block "
                     "recomputed from its input)")
    if r.granularity != Granularity.full and not graphs:
        tries.append("recompute=full with vision=frozen_with_projector (full recompute alone leaves the "
                     "trainable deepstack mergers without gradient)" if deepstack_blocks_full_recompute(run)
                     else "recompute=full")
    return tries


def memory_message(run: RunConfig, res: Resolved, b: memory.MemoryBreakdown, verdict: str) -> str:
    """The estimate's verdict, its largest parts and the overrides to try, none of them a setting in effect
    (preflight; an OOM's failure record), ending with the least world of this hardware that fits."""
    lay, hw = res.layout, run.hardware
    top = sorted(b.items().items(), key=lambda kv: -kv[1])[:3]
    state = b.params + b.grads + b.optimizer
    shard = ("Megatron-FSDP shards it over more GPUs only" if is_fsdp(run) else
             "shard the model further (parallelism.ep/pp, parallelism=fsdp) before touching activations")
    hints = f" Model state alone (params+grads+optimizer) is {state:.0f} GiB: {shard}." if state > hw.memory_gib else ""
    tries = _less_activation(run)
    if lay.ep < world.auto_ep(lay.world_size, lay.pp, lay.etp, run.model.num_experts):
        tries.append("a larger parallelism.ep")
    if not is_fsdp(run) and memory.keeps_remainders(run):
        if not run.precision.precision_aware_optimizer:
            tries.append("precision.precision_aware_optimizer=true (Adam's exact FP32 state in 10 instead of 12 "
                         "bytes per parameter)")
        if not bridge(run, "optimizer", "optimizer_cpu_offload"):
            tries.append("+bridge.optimizer.optimizer_cpu_offload=true "
                         "+bridge.optimizer.optimizer_offload_fraction=1.0 with "
                         "precision.precision_aware_optimizer=true (Megatron's optimizer CPU offload: Adam's state and "
                         "step on the host, not in the estimate)")
    if res.packing_capacity:
        tries.append(f"a smaller data.packing (now {res.packing_capacity} tokens per micro-batch row; the same "
                     "train.global_batch_size rows then carry fewer samples per step)")
    elif run.train.micro_batch_size > 1:
        tries.append("a smaller train.micro_batch_size")
    least, alone = least_world(run, res), ""
    if least:
        tries.append(f"more GPUs: it needs at least {least.world_size} x {hw.name} (nodes={least.nodes} "
                     f"gpus_per_node={least.gpus_per_node}) with these settings")
    else:
        alone = (f" More GPUs alone will not do: no world up to {MAX_NODES} x {hw.gpus_per_node} {hw.name} fits these "
                 "settings.")
    advice = (" Try " + ", ".join(tries[:-1]) + (" or " if len(tries) > 1 else "") + f"{tries[-1]}.") if tries else ""
    return (f"model={run.model.name} {verdict}: estimated {b.total:.0f} GiB per GPU (PP stage {b.stage}; largest: "
            + ", ".join(f"{k} {v:.0f}" for k, v in top)
            + f") vs hardware={hw.name} memory_gib={hw.memory_gib:.0f}, with "
            f"parallelism={'fsdp' if is_fsdp(run) else '3d'} (EP {lay.ep}, DP {lay.dp}), {recompute_text(run)}, "
            f"train.micro_batch_size={run.train.micro_batch_size}, seq {b.seq_len}." + advice + alone + hints)


@rule(Severity.error)
def memory_fits(run: RunConfig, res: Resolved) -> str | None:
    b, frac = _memory_verdict(run, res)
    return memory_message(run, res, b, "does not fit") if frac > 1.0 else None


@rule(Severity.warning)
def memory_headroom(run: RunConfig, res: Resolved) -> str | None:
    b, frac = _memory_verdict(run, res)
    return memory_message(run, res, b, f"is tight ({frac:.0%})") if memory.TIGHT < frac <= 1.0 else None
