"""Hydra's per-run files with secrets masked. conf/train.yaml turns Hydra's own writer off (`hydra.output_subdir:
null`: it would save `+bridge.logger.comet_api_key=...` verbatim) and this callback writes the same three files
into `<run dir>/.hydra/` at job start, before the task runs, where the report and a person look for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from vlmtrain.config import redact

SUBDIR = ".hydra"


def write(config: DictConfig) -> Path:
    """config.yaml, hydra.yaml and overrides.yaml of this job (config.redact.hydra_files) in its run dir."""
    out = Path(str(config.hydra.runtime.output_dir)) / SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    for name, tree in redact.hydra_files(config).items():
        OmegaConf.save(OmegaConf.create(tree), out / name)
    return out


class RedactedHydraFiles(Callback):
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        write(config)
