"""Finalize a ConfigContainer as it would be finalized on the declared target, from any machine.

Bridge's `runtime_config_update()` reads the world size from the environment and, for flex dispatchers,
queries GPU 0's properties. A dry run on a login node presents the declared hardware instead (its compute
capability and name) and the declared world size; the process environment is restored afterwards, since
Bridge also exports the config's env_vars while finalizing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


@contextlib.contextmanager
def declared_target(run: RunConfig, res: Resolved) -> Iterator[None]:
    """World size and GPU properties of the declared target, for the duration of the block."""
    import torch

    saved_env = dict(os.environ)
    saved_props = torch.cuda.get_device_properties
    hw = run.hardware
    os.environ.update(WORLD_SIZE=str(res.layout.world_size), RANK="0", LOCAL_RANK="0")
    if not torch.cuda.is_available():
        props = SimpleNamespace(
            major=hw.sm_major,
            minor=hw.sm_minor,
            name=hw.device_name,
            total_memory=int(hw.memory_gib * 2**30),
            multi_processor_count=132,
        )
        torch.cuda.get_device_properties = lambda *_a, **_k: props
    try:
        yield
    finally:
        torch.cuda.get_device_properties = saved_props
        os.environ.clear()
        os.environ.update(saved_env)


def finalize(run: RunConfig, res: Resolved, cfg: ConfigContainer) -> None:
    """Bridge's own finalization and validation (what pretrain() runs first), on the declared target."""
    from megatron.bridge.training.config import runtime_config_update

    with declared_target(run, res):
        runtime_config_update(cfg)
