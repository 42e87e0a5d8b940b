"""recompute group: activation recomputation (the ViT inherits granularity, method and layer count).

| option    | recompute_granularity | recompute_modules        | recompute_method / num_layers |
|-----------|-----------------------|--------------------------|-------------------------------|
| none      | None                  | [] (explicitly empty)    | None / None                   |
| selective | selective             | the YAML's module list   | None / None                   |
| full      | full                  | []                       | uniform / 1                   |

`auto` (the default) reads as `none` until the run is placed; there it settles to `none`, or the least of
`selective`, `selective` with the whole MoE block recomputed (`moe` in place of `moe_act`) and `full` that the
memory estimate needs (vlmtrain.check.defaults).

`none` writes an empty list on purpose: left unset, Megatron Core silently promotes it to ["core_attn"].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


class Granularity(StrEnum):
    none = "none"
    selective = "selective"
    full = "full"


class Method(StrEnum):
    uniform = "uniform"
    block = "block"


OWNS = frozenset(
    {
        "model.recompute_granularity",
        "model.recompute_modules",
        "model.recompute_method",
        "model.recompute_num_layers",
    }
)


@dataclass
class RecomputeConfig:
    granularity: Granularity = Granularity.none
    modules: list[str] = field(default_factory=list)
    """Selective only: from core_attn, moe_act, layernorm, mlp, moe, shared_experts, gdn_norm_out."""
    method: Method = Method.uniform
    """Full only: uniform or block."""
    num_layers: int = 1
    """Full only: layers per recompute chunk (uniform) or recomputed layers per stage (block)."""
    auto: bool = False
    """recompute=auto (the default): settled where the run is placed (vlmtrain.check.defaults), read as `none` until
    then."""


def apply(run: RunConfig, res: Resolved, cfg: ConfigContainer) -> None:
    r, m = run.recompute, cfg.model
    full = r.granularity == Granularity.full
    m.recompute_granularity = None if r.granularity == Granularity.none else str(r.granularity)
    m.recompute_modules = list(r.modules) if r.granularity == Granularity.selective else []
    m.recompute_method = str(r.method) if full else None
    m.recompute_num_layers = r.num_layers if full else None
