"""Predicted step time, useful tokens/s/GPU and MFU of a composed run on its resolved world, before it queues.

Pure arithmetic on the RunConfig, its resolved values (config.resolve: layout, stage split, grad-accum, padding) and
a workload (`workload.planned`: the data's lengths and declared images), like the memory estimate beside it; the
dry-run plan, the -m sweeper's table, `vlmtrain tune --plan` and every launched run (`speed.json`, which the report
puts beside what the run measured) read the one prediction `predict` makes.

| term            | what is counted (per rank)                                       | rate from              |
|-----------------|------------------------------------------------------------------|------------------------|
| vision, decoder | config.flops' FLOPs of the tokens that run (padding, recompute): | hardware peak x fitted |
|                 | ViT; dense GEMMs + attention; routed experts (+ a fixed time per | fraction per tower and |
|                 | local expert), by the kernels group's expert GEMM                | op class               |
| dispatch        | MoE all-to-all: tokens x top-k x hidden, (EP-1)/EP off-rank, the | NVLink / NIC per GPU   |
|                 | off-domain share over the NIC (HybridEP/DeepEP: once per domain) | (hardware group) x the |
| tensor_parallel | SP all-gathers and reduce-scatters per layer; ViT all-reduces    | share nccl-tests reach |
| fsdp            | Megatron-FSDP BF16 gathers fwd + bwd, FP32 reduce-scatter, every |                        |
|                 | micro-batch, hidden behind compute but the first unit            |                        |
| grad_reduce,    | DDP: FP32 reduce-scatter, BF16 all-gather once per step, hidden  |                        |
| param_gather    | behind the last backward / first forward but one bucket          |                        |
| pipeline        | bubble (PP-1)/VPP micro-batches; sends of tokens x hidden        |                        |
| optimizer       | Adam's state, gradient and weight bytes on the rank's shard      | HBM x fitted fraction  |
| host            | per decoder layer, Gated-DeltaNet layer, ViT block, FSDP unit,   | fitted seconds, partly |
|                 | image (Bridge's loop), micro-batch and step                      | hidden (fitted)        |

Which overlaps are modelled and why: `step`'s docstring. The fitted constants: `calibration.json` (their commit and
rows), written by `vlmtrain lab calibrate-speed --fit`. Modules: `workload`, `terms`, `step`, `calibration`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlmtrain.check.speed import step
from vlmtrain.check.speed.calibration import Calibration, load
from vlmtrain.check.speed.step import SPEED_JSON, TERMS, StepTime, predict, render, save
from vlmtrain.check.speed.workload import Workload, planned

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

__all__ = ["SPEED_JSON", "TERMS", "Calibration", "StepTime", "Workload", "load", "planned", "predict", "predicted",
           "render", "save", "step"]


def predicted(run: RunConfig, res: Resolved) -> StepTime:
    """The prediction every consumer shows: `predict` on the planned workload."""
    return predict(run, res, planned(run, res))
