"""The model under Megatron's wrappers: a model chunk Bridge hands a callback or the checkpoint loader returns is
wrapped (DDP or Megatron-FSDP, Float16Module), and the after-build checks, the step timers and the lab's logits
parity read the model inside."""

from __future__ import annotations

from typing import Any


def unwrap(chunk: Any) -> Any:
    """The module a model chunk wraps, through every wrapper's `.module`."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk
