"""Compose: Hydra config -> typed RunConfig, through Hydra's own compose API where no @hydra.main runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from vlmtrain.schema import RunConfig, register

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("model", "data", "parallelism", "hardware", "dispatcher", "recompute", "cuda_graph", "kernels", "vision",
          "precision")


def to_run(cfg: DictConfig, choices: dict[str, Any] | None = None, output_dir: str | None = None) -> RunConfig:
    """The typed RunConfig (runs schema checks) with the group choices and run directory filled in."""
    cfg = cfg.copy()
    if "hydra" in cfg:
        choices = choices or dict(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]
    if choices:
        cfg.choices = {g: str(choices.get(g)) for g in (*GROUPS, "experiment") if choices.get(g) is not None}
    if output_dir is not None:
        cfg.output_dir = output_dir
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]


def compose(overrides: list[str] | tuple[str, ...] = (), output_dir: str = "outputs/compose") -> RunConfig:
    """Compose conf/train.yaml with CLI-style overrides, exactly as train.py would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    return to_run(cfg, output_dir=output_dir)
