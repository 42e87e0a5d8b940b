"""Shared fixtures: compose the shipped configs exactly as train.py does (Hydra's compose API)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def compose() -> Callable[..., object]:
    """compose(*overrides) -> RunConfig, through Hydra's compose API (no global Hydra state is kept)."""
    from vlmtrain.config.compose import compose as vlm_compose

    def _compose(*overrides: str, output_dir: str = "outputs/test") -> object:
        return vlm_compose(list(overrides), output_dir=output_dir)

    return _compose


@pytest.fixture(scope="session")
def bridge() -> object:
    """Import Megatron Bridge (with real Transformer Engine) once per session; ~40 s on 2 cores."""
    import megatron.bridge.training.config as config

    return config


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data cache_dir for the session: the sample photos are written once for every data test."""
    return tmp_path_factory.mktemp("cache")
