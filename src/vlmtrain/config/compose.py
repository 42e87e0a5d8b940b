"""Compose: Hydra config -> typed RunConfig, through Hydra's own compose API where no @hydra.main runs; and a
saved run config -> RunConfig again."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from vlmtrain.config.groups import CHOSEN
from vlmtrain.config.schema import CONF_DIR, RunConfig, register

__all__ = ["CONF_DIR", "compose", "load_run", "to_run"]


def _checkpoint_dir(output_dir: str, hydra: DictConfig) -> str:
    """train.checkpoint_dir when unset. Single run: same command -> same checkpoints, so a relaunch resumes; the
    name is Hydra's override_dirname without the secret overrides (config.redact.override_dirname). Sweep job: its
    own run dir (a requeued job keeps it; override_dirname holds only the swept values and would collide across
    sweeps); so is a config composed outside a Hydra run (compose())."""
    from hydra.types import RunMode

    from vlmtrain.config import redact

    if hydra.mode == RunMode.RUN:
        c = hydra.job.config.override_dirname
        name = redact.override_dirname(list(hydra.overrides.task), list(c.exclude_keys), c.item_sep, c.kv_sep)
        return f"checkpoints/{name or 'default'}"
    return f"{output_dir}/checkpoints"


def to_run(cfg: DictConfig, hydra: DictConfig | None = None, output_dir: str | None = None,
           owned: bool = False) -> RunConfig:
    """The typed RunConfig (runs schema checks) with what Hydra decided filled in: the group choices, the run
    directory and the checkpoint directory. `hydra`: Hydra's config (HydraConfig.get() under @hydra.main), else
    cfg's own `hydra` node (compose with return_hydra_config, a sweeper's job config). `owned`: cfg is the caller's
    own, changed in place (a copy is a tenth of a compose)."""
    cfg = cfg if owned else cfg.copy()
    hydra = hydra if hydra is not None else cfg.get("hydra")
    if output_dir is not None:
        cfg.output_dir = output_dir
    if hydra is not None:
        choices = hydra.runtime.choices
        cfg.choices = {g: str(choices.get(g)) for g in (*CHOSEN, "experiment") if choices.get(g) is not None}
        if cfg.train.checkpoint_dir is None:
            cfg.train.checkpoint_dir = _checkpoint_dir(cfg.output_dir, hydra)
    if "hydra" in cfg:
        with open_dict(cfg):
            del cfg["hydra"]
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]


def compose(overrides: list[str] | tuple[str, ...] = (), output_dir: str = "outputs/compose") -> RunConfig:
    """Compose conf/train.yaml with CLI-style overrides, exactly as train.py would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    return to_run(cfg, output_dir=output_dir, owned=True)


def load_run(saved: str | Path | Mapping[str, Any]) -> RunConfig:
    """The RunConfig of a saved run config (a run_config.yaml, or its already loaded tree), checked by the schema;
    `${oc.env:...}` references to secrets resolve from this process's environment."""
    tree = saved if isinstance(saved, Mapping) else OmegaConf.load(saved)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), tree))  # type: ignore[return-value]
