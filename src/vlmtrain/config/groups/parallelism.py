"""parallelism group: Megatron-FSDP or 3D (TP/PP/VPP/CP/EP/ETP) and the DDP/checkpoint fields each needs.

| option | what it writes |
|--------|----------------|
| fsdp   | TP=CP=PP=1 (from the YAML), EP sized to the experts; `ddp.use_megatron_fsdp`, `dist.use_megatron_fsdp`, |
|        | ZeRO-3 sharding (`optim_grads_params`), overlapped grad reduce / param gather, meta-device init,      |
|        | `checkpoint.ckpt_format=fsdp_dtensor` (Bridge asserts it)                                            |
| 3d     | the TP/PP/VPP/CP/EP/ETP knobs, SP when TP>1, distributed optimizer, `ckpt_format=torch_dist`          |

| auto   | the default: `3d` on a one-GPU world (EP 1: 1.16x FSDP on one H200, Qwen3-VL-30B-A3B's shapes at 4     |
|        | layers, results/tune_h200/report.md), else                                                              |
|        | `fsdp` (a new run's first layout), settled where the run is placed (check.defaults); unsettled: fsdp    |

`ep: null` means "auto": the largest degree dividing both the expert count and the ranks per pipeline stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


class Kind(StrEnum):
    fsdp = "fsdp"
    three_d = "3d"
    auto = "auto"
    """The default: 3d with EP 1 on one GPU, else fsdp, settled where the run is placed (check.defaults)."""


KINDS = tuple(k.value for k in Kind)


OWNS = frozenset(
    {
        "model.tensor_model_parallel_size",
        "model.pipeline_model_parallel_size",
        "model.virtual_pipeline_model_parallel_size",
        "model.context_parallel_size",
        "model.expert_model_parallel_size",
        "model.expert_tensor_parallel_size",
        "model.sequence_parallel",
        "model.num_layers_in_first_pipeline_stage",
        "model.num_layers_in_last_pipeline_stage",
        "model.init_model_with_meta_device",
        "ddp.use_megatron_fsdp",
        "ddp.data_parallel_sharding_strategy",
        "ddp.use_distributed_optimizer",
        "ddp.overlap_grad_reduce",
        "ddp.overlap_param_gather",
        "ddp.average_in_collective",
        "dist.use_megatron_fsdp",
        "optimizer.use_distributed_optimizer",
        "checkpoint.ckpt_format",
    }
)


@dataclass
class ParallelismConfig:
    kind: str = "fsdp"
    """fsdp: Megatron-FSDP (bring-up, memory first); 3d: TP/PP/EP layouts (higher ceiling after tuning); auto:
    settled to 3d on one GPU, else fsdp, where the run is placed (check.defaults)."""
    tp: int = 1
    """Tensor parallel size (model.tensor_model_parallel_size); must divide the KV heads."""
    pp: int = 1
    """Pipeline parallel size."""
    vpp: int | None = None
    """Virtual pipeline stages per rank; layers per stage must divide by it."""
    cp: int = 1
    """Context parallel size."""
    ep: int | None = None
    """Expert parallel size; null = sized to the experts automatically."""
    etp: int | None = None
    """Expert tensor parallel size; null = 1. Use it only when EP alone is not enough."""
    first_stage_layers: int | None = None
    """Decoder layers on PP stage 0 (it also carries the ViT); null = even split."""
    last_stage_layers: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"parallelism.kind={self.kind!r}: choose one of {KINDS} (parallelism=fsdp|3d|auto).")


def is_fsdp(run: RunConfig) -> bool:
    """Megatron-FSDP: parallelism=fsdp, or an auto not yet settled (check.defaults), which reads as a new run's
    first layout."""
    return run.parallelism.kind in (Kind.fsdp, Kind.auto)


def apply(run: RunConfig, res: Resolved, cfg: ConfigContainer) -> None:
    lay = res.layout
    m = cfg.model
    m.tensor_model_parallel_size = lay.tp
    m.pipeline_model_parallel_size = lay.pp
    m.virtual_pipeline_model_parallel_size = lay.vpp
    m.context_parallel_size = lay.cp
    m.expert_model_parallel_size = lay.ep
    m.expert_tensor_parallel_size = lay.etp
    m.sequence_parallel = lay.tp > 1
    m.num_layers_in_first_pipeline_stage = run.parallelism.first_stage_layers
    m.num_layers_in_last_pipeline_stage = run.parallelism.last_stage_layers
    fsdp = is_fsdp(run)
    m.init_model_with_meta_device = fsdp
    cfg.ddp.use_megatron_fsdp = fsdp
    cfg.dist.use_megatron_fsdp = fsdp
    cfg.ddp.data_parallel_sharding_strategy = "optim_grads_params" if fsdp else "no_shard"
    cfg.ddp.use_distributed_optimizer = True
    cfg.optimizer.use_distributed_optimizer = True
    cfg.ddp.overlap_grad_reduce = True
    cfg.ddp.overlap_param_gather = True
    # Megatron-FSDP forces False; with CP the per-token SFT loss needs False too (Bridge validate).
    cfg.ddp.average_in_collective = not fsdp and lay.cp == 1
    cfg.checkpoint.ckpt_format = "fsdp_dtensor" if fsdp else "torch_dist"
