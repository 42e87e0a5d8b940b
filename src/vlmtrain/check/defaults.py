"""Fast defaults: the `auto` options settled for the world a run is placed on, before preflight.

A user who names only the model, data, hardware and world gets every replacement proven equal for that model
and hardware: the layout measured fastest for the world size, the kernels group's (config.groups.kernels.settle)
and packing at the largest capacity the memory estimate fits (here, in check/, because it needs the estimate and
the packing proofs). Each value set explicitly wins; each replacement left off is recorded with why
(`Resolved.auto`), which preflight's `auto_left_off` says and the dry-run plan shows. `placed` is the one path
train.py, the -m sweeper and the tuner's candidates take.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from vlmtrain.check import memory
from vlmtrain.check.preflight.packing import QWEN35_PACKING_PROVEN, unscanned
from vlmtrain.config import world
from vlmtrain.config.groups import kernels, precision
from vlmtrain.config.groups.data import AUTO
from vlmtrain.config.groups.data import Kind as DataKind
from vlmtrain.config.groups.model import Family
from vlmtrain.config.groups.parallelism import Kind as ParKind
from vlmtrain.config.groups.parallelism import is_fsdp
from vlmtrain.config.resolve import Auto, Resolved, resolve
from vlmtrain.data.photos import PHOTOS

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig

PACK_ROWS = 3
"""Auto packing's largest capacity, in train.seq_length samples: 12288 at seq 4096, the capacity the H1 tune and the
2 x H200 sweep measured fastest (experiment=tune_h1, perf_h200x2_best)."""
PACK_STEP = 256
"""Auto packing steps its capacity down by this many tokens until the memory estimate fits (12032 at H1 with the
ViT's padded heads, as experiment=perf_h200_best)."""


def placed(run: RunConfig, node_gpus: int, slurm_tasks_per_node: int | None = None) -> tuple[world.Placement, Resolved]:
    """A composed run placed on the world it will run on (world.placement: `run.gpus_per_node` set to it), its
    `auto` options settled there, then resolved."""
    place = world.placement(run, node_gpus, slurm_tasks_per_node)
    run.gpus_per_node = place.gpus_per_node
    return place, settle(run)


def settle(run: RunConfig) -> Resolved:
    """Every `auto` option of `run` settled in place (the layout first: weight-gradient fusion depends on it; then
    the kernels: the ViT's padded heads cost memory the packing capacity must leave room for), then resolved, with
    what was settled in `Resolved.auto`."""
    picks = _layout(run)
    picks += kernels.settle(run, three_d=not is_fsdp(run))
    picks += _packing(run)
    return dataclasses.replace(resolve(run), auto=tuple(picks))


def _layout(run: RunConfig) -> list[Auto]:
    """parallelism=auto settled for the world size: 3d on one GPU (EP 1, the only degree there), else fsdp."""
    if run.parallelism.kind != ParKind.auto:
        return []
    if run.nodes * world.gpus_per_node(run) == 1:
        run.parallelism.kind = ParKind.three_d
        return [Auto("parallelism", "3d", "one GPU: 3D (EP 1) ran 1.16x Megatron-FSDP's useful tokens/s at H1 "
                     "(results/tune_h200/report.md, layout stage)")]
    run.parallelism.kind = ParKind.fsdp
    return [Auto("parallelism", "fsdp", "more than one GPU: Megatron-FSDP, the guidance's first layout "
                 "(docs/design.md, FSDP first); parallelism=3d is one override away")]


def packing_off(run: RunConfig) -> str | None:
    """Why auto packing stays off for this run, or None where packing is proven and possible."""
    m, hw, t = run.model, run.hardware, run.train
    if m.family == Family.qwen35_vl and not QWEN35_PACKING_PROVEN:
        return ("Qwen3.5 packing is not yet proven equal to per-sample training on a GPU (issue 48: "
                "check.preflight.packing.QWEN35_PACKING_PROVEN)")
    if hw.sm_major != kernels.SM90:
        return (f"packing was proven equal on H200 (SM90) only (vlmtrain.lab.checks.packing_equivalence), not "
                f"hardware={hw.name}")
    if precision.quantized(run):
        return f"packing was proven equal in BF16 only, not precision={run.precision.format}"
    if unscanned(run):
        return f"data={run.data.kind} is not read by the data scan, which packing bins from"
    if run.data.kind == DataKind.sample:
        return (f"data=sample is the {len(PHOTOS)}-photo smoke set: packed, it fills fewer rows than one global batch "
                "(each step would repeat the same row)")
    if t.micro_batch_size != 1:
        return (f"train.micro_batch_size={t.micro_batch_size} asks for padded micro-batches (a packed micro-batch "
                "is one row: train.micro_batch_size=1)")
    if "attn" in run.cuda_graph.modules:
        return "an attention CUDA graph replays fixed sequence boundaries (preflight: packing_with_graphs)"
    if run.data.truncate_long_samples:
        return "data.truncate_long_samples=true: packing never cuts a sample"
    return None


def _packing(run: RunConfig) -> list[Auto]:
    """data.packing=auto settled: off where packing_off says why, else the largest capacity from PACK_ROWS x
    train.seq_length down to train.seq_length (steps of PACK_STEP, aligned) whose memory estimate fits."""
    if run.data.packing != AUTO:
        return []
    why = packing_off(run)
    seq = run.train.seq_length
    if why is None:
        run.data.packing = seq  # the alignment, from the layout and precision
        step = math.lcm(PACK_STEP, resolve(run).pack_align)
        for cap in range(PACK_ROWS * seq // step * step, seq - 1, -step):
            run.data.packing = cap
            if memory.estimate(run, resolve(run)).total <= run.hardware.memory_gib:
                return [Auto("data.packing", str(cap), f"the largest row up to {PACK_ROWS} x train.seq_length that "
                             f"the memory estimate fits; packing proven equal for model={run.model.name} "
                             "(results/packing_equivalence.jsonl); train.global_batch_size counts rows")]
        why = f"the memory estimate fits no packed row of train.seq_length={seq} tokens or more"
    run.data.packing = False
    return [Auto("data.packing", "off", why)]
