"""Shared fixtures: compose the shipped configs exactly as train.py does (Hydra's compose API)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def compose() -> Iterator[Callable[..., object]]:
    """compose(*overrides) -> RunConfig, inside one Hydra context for speed."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from vlmtrain.compose import CONF_DIR, to_run
    from vlmtrain.schema import register

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):

        def _compose(*overrides: str, output_dir: str = "outputs/test") -> object:
            cfg = hydra_compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
            return to_run(cfg, output_dir=output_dir)

        yield _compose


@pytest.fixture(scope="session")
def bridge() -> object:
    """Import Megatron Bridge (with real Transformer Engine) once per session; ~40 s on 2 cores."""
    import megatron.bridge.training.config as config

    return config
