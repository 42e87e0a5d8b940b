"""Preflight rules: the per-GPU memory estimate (check.memory) against the hardware group's memory_gib."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlmtrain.check import memory
from vlmtrain.check.preflight.recompute_graphs import deepstack_blocks_full_recompute
from vlmtrain.check.preflight.registry import Severity, rule
from vlmtrain.config.groups.parallelism import is_fsdp

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


def _memory_verdict(run: RunConfig, res: Resolved) -> tuple[memory.MemoryBreakdown, float]:
    """(estimate, fraction of the hardware group's memory_gib): pure arithmetic, no Bridge import."""
    b = memory.estimate(run, res)
    return b, b.total / run.hardware.memory_gib


def memory_message(run: RunConfig, res: Resolved, b: memory.MemoryBreakdown, verdict: str) -> str:
    """The estimate's verdict, its largest parts and the overrides to try (preflight; an OOM's failure record)."""
    lay = res.layout
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
    tries = [fewer, "a larger parallelism.ep (more nodes once EP spans all GPUs)" if lay.ep < lay.world_size else
             "more GPUs (gpus_per_node, nodes: the model state shards over them)"]
    if not run.precision.precision_aware_optimizer and not is_fsdp(run) and memory.keeps_remainders(run):
        tries.append("precision.precision_aware_optimizer=true (Adam's exact FP32 state in 10 instead of 12 bytes "
                     "per parameter)")
    if res.packing_capacity:
        tries.append(f"a smaller data.packing (now {res.packing_capacity} tokens per micro-batch row; the same "
                     "train.global_batch_size rows then carry fewer samples per step)")
    elif run.train.micro_batch_size > 1:
        tries.append("a smaller train.micro_batch_size")
    return (f"model={run.model.name} {verdict}: estimated {b.total:.0f} GiB per GPU (PP stage {b.stage}; largest: "
            + ", ".join(f"{k} {v:.0f}" for k, v in top)
            + f") vs hardware={run.hardware.name} memory_gib={run.hardware.memory_gib:.0f}, with "
            f"parallelism={run.parallelism.kind} (EP {lay.ep}, DP {lay.dp}), "
            f"recompute={c.get('recompute', run.recompute.granularity)}, "
            f"train.micro_batch_size={run.train.micro_batch_size}, seq {b.seq_len}. Try "
            + ", ".join(tries[:-1]) + f" or {tries[-1]}." + hints)


@rule(Severity.error)
def memory_fits(run: RunConfig, res: Resolved) -> str | None:
    b, frac = _memory_verdict(run, res)
    return memory_message(run, res, b, "does not fit") if frac > 1.0 else None


@rule(Severity.warning)
def memory_headroom(run: RunConfig, res: Resolved) -> str | None:
    b, frac = _memory_verdict(run, res)
    return memory_message(run, res, b, f"is tight ({frac:.0%})") if memory.TIGHT < frac <= 1.0 else None
