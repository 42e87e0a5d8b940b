"""cuda_graph group: Transformer Engine per-layer CUDA graphs and their scope.

| option                     | cuda_graph_impl    | cuda_graph_modules                 |
|----------------------------|--------------------|------------------------------------|
| none                       | none               | []                                 |
| moe_router_preprocess      | transformer_engine | [moe_router, moe_preprocess]       |
| attn_moe_router_preprocess | transformer_engine | [attn, moe_router, moe_preprocess] |

Scopes go through Bridge's set_cuda_graph_modules() (assigning the deprecated cuda_graph_scope next to
cuda_graph_modules asserts). TE graphs need the TE RNG tracker and static shapes (data pads to seq_length).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

OWNS = frozenset(
    {
        "model.cuda_graph_impl",
        "model.cuda_graph_modules",
        "model.cuda_graph_warmup_steps",
        "model.use_te_rng_tracker",
        "rng.te_rng_tracker",
    }
)


@dataclass
class CudaGraphConfig:
    modules: list[str] = field(default_factory=list)
    """Captured scopes, from attn, mlp, moe, moe_router, moe_preprocess; [] = no graphs."""
    warmup_steps: int = 3
    """Eager steps before capture (model.cuda_graph_warmup_steps)."""


def enabled(run: RunConfig) -> bool:
    return bool(run.cuda_graph.modules)


def apply(run: RunConfig, res: Resolved, cfg: ConfigContainer) -> None:
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

    m, on = cfg.model, enabled(run)
    m.cuda_graph_impl = "transformer_engine" if on else "none"
    set_cuda_graph_modules(m, list(run.cuda_graph.modules))
    m.cuda_graph_warmup_steps = run.cuda_graph.warmup_steps
    m.use_te_rng_tracker = on
    cfg.rng.te_rng_tracker = on
