"""vision group: which towers train. All three freeze flags are always written: Bridge's Qwen3-VL-MoE
provider defaults to a frozen LM and ViT, so leaving any flag unset would silently train only the projector.

| option                | freeze_vision_model | freeze_vision_projection | freeze_language_model |
|-----------------------|---------------------|--------------------------|-----------------------|
| trainable             | False               | False                    | False                 |
| frozen                | True                | False                    | False                 |
| frozen_with_projector | True                | True                     | False                 |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

OWNS = frozenset({"model.freeze_vision_model", "model.freeze_vision_projection", "model.freeze_language_model"})


@dataclass
class VisionConfig:
    freeze_vision_model: bool = False
    """Freeze the ViT blocks (decoder-focused tuning; its backward disappears)."""
    freeze_vision_projection: bool = False
    """Freeze the merger/projector and deepstack mergers too."""
    freeze_language_model: bool = False


def frozen(run: RunConfig) -> bool:
    return run.vision.freeze_vision_model


def apply(run: RunConfig, res: Resolved, cfg: ConfigContainer) -> None:
    cfg.model.freeze_vision_model = run.vision.freeze_vision_model
    cfg.model.freeze_vision_projection = run.vision.freeze_vision_projection
    cfg.model.freeze_language_model = run.vision.freeze_language_model
