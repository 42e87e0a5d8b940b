"""The step-time model's fitted constants, read once from `calibration.json` beside this module.

`vlmtrain lab calibrate-speed --fit` writes the file from the project's measured rows (results/*.jsonl) and records
the commit, the command, the rows it fitted and the rows it held out with their error; nothing else writes it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

PATH = Path(__file__).with_name("calibration.json")


@dataclass(frozen=True)
class Calibration:
    """What the hardware group's peaks and bandwidths do not say: how much of them a step reaches, and what the host
    costs per launch. Every field is fitted on measured rows (the file's `source` names them)."""

    vit_fraction: float
    """Achieved share of the dense BF16 peak by the ViT and projector GEMMs and attention."""
    dense_fraction: float
    """Achieved share of the decoder GEMMs' peak by its dense GEMMs (attention, shared expert, router, logits) and
    attention core."""
    expert_fraction: float
    """Achieved share of the decoder GEMMs' peak by the routed experts' GEMMs (either implementation: the same
    FLOPs; what differs is the fixed time per expert below)."""
    expert_gemm_s: float
    """Fixed time per local expert, MoE layer and micro-batch with one GEMM per expert on streams
    (kernels.moe_grouped_gemm=multistream): the per-expert launches and small-GEMM tails of forward, data and
    weight gradients."""
    expert_cutlass_gemm_s: float
    """The same inside TE's one CUTLASS grouped GEMM (kernels.moe_grouped_gemm=cutlass)."""
    hbm_fraction: float
    """Achieved share of the HBM bandwidth by the optimizer's update (read and write of its state)."""
    layer_host_s: float
    """Host time per decoder layer and micro-batch (launches, the MoE dispatcher's host syncs), forward and
    backward."""
    gdn_layer_host_s: float
    """Extra time per Gated-DeltaNet layer and micro-batch (Qwen3.5): FLA's chunked delta-rule kernels, launch- and
    sync-bound at these sizes, beyond their FLOPs."""
    vit_block_host_s: float
    """Host time per ViT block and micro-batch, forward and backward."""
    fsdp_unit_host_s: float
    """Host time per Megatron-FSDP unit (decoder layer, ViT block) and micro-batch: its gather, reshard and
    reduce hooks."""
    image_host_s: float
    """Host time per image under Bridge's per-image position loop (kernels.vit_positions=loop)."""
    microbatch_host_s: float
    """Host time per micro-batch outside the towers: embedding, MRoPE index, loss, the batch's copies."""
    step_host_s: float
    """Host time per step outside the micro-batches: the optimizer's launches, grad norm, bookkeeping."""
    host_hidden: float
    """Share of a tower's host time that runs under its GPU time (0: host and GPU add, 1: the longer one wins)."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@functools.cache
def source(path: Path = PATH) -> dict[str, Any]:
    """The whole file: `constants` and `source` (commit, command, fitted and held-out rows, their error)."""
    return json.loads(path.read_text())


def load(path: Path = PATH) -> Calibration:
    """The fitted constants (a missing or partial file is named, not read as defaults)."""
    constants = source(path)["constants"]
    missing = [n for n in Calibration.names() if n not in constants]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)}; refit with `vlmtrain lab calibrate-speed --fit`")
    return Calibration(**{n: float(constants[n]) for n in Calibration.names()})
