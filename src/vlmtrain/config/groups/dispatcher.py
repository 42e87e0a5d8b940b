"""dispatcher group: how MoE tokens move between expert-parallel ranks.

| option   | model.moe_token_dispatcher_type | model.moe_flex_dispatcher_backend | needs                       |
|----------|---------------------------------|-----------------------------------|-----------------------------|
| alltoall | alltoall                        | None                              | nothing extra               |
| hybridep | flex                            | hybridep                          | DeepEP hybrid-ep build, env |
| deepep   | flex                            | deepep                            | DeepEP build; not on GB200  |
| auto     | the hardware group's `default_dispatcher`                                                         |

Flex dispatchers forbid shared-expert overlap. HybridEP's topology env vars are resolved with the others (Resolved.env).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


class Backend(StrEnum):
    alltoall = "alltoall"
    hybridep = "hybridep"
    deepep = "deepep"


OWNS = frozenset(
    {
        "model.moe_token_dispatcher_type",
        "model.moe_flex_dispatcher_backend",
        "model.moe_flex_dispatcher_num_sms",
        "model.moe_shared_expert_overlap",
    }
)


@dataclass
class DispatcherConfig:
    backend: Backend = Backend.alltoall
    """Token dispatcher; `dispatcher=auto` takes the hardware group's default."""
    num_sms: int | None = None
    """SMs given to the flex (HybridEP/DeepEP) kernels (model.moe_flex_dispatcher_num_sms); null = library default."""


def apply(run: RunConfig, res: Resolved, cfg: ConfigContainer) -> None:
    m = cfg.model
    if run.dispatcher.backend == Backend.alltoall:
        m.moe_token_dispatcher_type = "alltoall"
        m.moe_flex_dispatcher_backend = None
        m.moe_flex_dispatcher_num_sms = None
        return
    m.moe_token_dispatcher_type = "flex"
    m.moe_flex_dispatcher_backend = str(run.dispatcher.backend)
    m.moe_flex_dispatcher_num_sms = run.dispatcher.num_sms
    m.moe_shared_expert_overlap = False  # flex dispatchers forbid it
