"""The root run config: one typed node per config group, registered in Hydra's ConfigStore.

`conf/train.yaml` starts its defaults list with `run_schema`, so every YAML option and CLI override is
type-checked against these dataclasses at compose time (a typo'd key fails before anything runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from vlmtrain.config.groups.cuda_graph import CudaGraphConfig
from vlmtrain.config.groups.data import DataConfig
from vlmtrain.config.groups.dispatcher import DispatcherConfig
from vlmtrain.config.groups.hardware import HardwareConfig
from vlmtrain.config.groups.kernels import KernelsConfig
from vlmtrain.config.groups.model import ModelConfig
from vlmtrain.config.groups.parallelism import ParallelismConfig
from vlmtrain.config.groups.precision import PrecisionConfig
from vlmtrain.config.groups.recompute import RecomputeConfig
from vlmtrain.config.groups.train import TrainConfig
from vlmtrain.config.groups.vision import VisionConfig

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
"""The repo's conf/: train.py's config path, the groups' YAML options."""


@dataclass
class WandbConfig:
    enabled: bool = True
    project: str = "vlmtrain"
    entity: str | None = None
    mode: str = "offline"
    """online | offline | disabled. Online without network falls back to offline at once."""
    group: str | None = None
    """null = the sweep (multirun directory) or the run name."""
    job_type: str = "train"
    tags: list[str] = field(default_factory=list)
    """Extra tags; every group choice, the model, data kind and versions are tagged automatically."""
    init_timeout_s: float = 15.0
    """Online only: how long wandb.init may wait for the server before the run falls back to offline."""
    views: bool = False
    """-m sweeps: when the sweep ends, build its W&B workspace and report (`vlmtrain wandb views`): saved online,
    else written as JSON next to the sweep with the command that publishes them."""


@dataclass
class PreflightConfig:
    fail_sweep: bool = False
    """In a -m sweep, fail the whole sweep on the first invalid job instead of skipping invalid jobs."""
    ignore: list[str] = field(default_factory=list)
    """Rule names whose errors are downgraded to warnings (use with care)."""


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    parallelism: ParallelismConfig = MISSING
    hardware: HardwareConfig = MISSING
    dispatcher: DispatcherConfig = MISSING
    recompute: RecomputeConfig = MISSING
    cuda_graph: CudaGraphConfig = MISSING
    kernels: KernelsConfig = MISSING
    vision: VisionConfig = MISSING
    precision: PrecisionConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    nodes: int = 1
    gpus_per_node: int | None = None
    """null = all GPUs of this node when launching locally, else the hardware group's GPUs per node."""
    dry_run: bool | None = None
    """null = dry run exactly when this machine has no GPU."""
    name: str = "vlmtrain"
    output_dir: str = "outputs"
    """The run directory (Hydra's job dir): logs, checkpoints, metrics, saved configs."""
    bridge: dict[str, Any] = field(default_factory=dict)
    """Any other Bridge field: +bridge.<section>.<field>=<value>."""
    choices: dict[str, str] = field(default_factory=dict)
    """The group options chosen (filled from Hydra's runtime choices; used in tags and the plan)."""


def _gpus_per_node(*, _root_: DictConfig) -> int:
    """`${vlmtrain.gpus_per_node:}`: `gpus_per_node`, else the hardware group's (world.gpus_per_node's rule),
    for config that only sees the raw config, e.g. conf/hydra/launcher/slurm.yaml's tasks and GPUs per node."""
    explicit = _root_.get("gpus_per_node")
    return int(explicit) if explicit is not None else int(_root_.hardware.gpus_per_node)


def _override_dirname(*, _root_: DictConfig) -> str:
    """`${vlmtrain.override_dirname:}`: Hydra's override_dirname without the secret overrides (config.redact), for
    the sweep-job directory names in conf/train.yaml."""
    from vlmtrain.config import redact

    h = _root_.hydra
    c = h.job.config.override_dirname
    return redact.override_dirname(list(h.overrides.task), list(c.exclude_keys), c.item_sep, c.kv_sep)


def _config_groups() -> str:
    """`${vlmtrain.config_groups:}`: the config groups a run composes, with their options, for train.py --help (Hydra's
    own list would also name conf/'s folders that are no group of the run: the lab's specs in conf/tune/)."""
    from vlmtrain.config.groups import CHOSEN

    return "\n".join(f"{g}: {', '.join(sorted(p.stem for p in (CONF_DIR / g).glob('*.yaml')))}"
                     for g in sorted((*CHOSEN, "experiment")))


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("vlmtrain.gpus_per_node"):
        OmegaConf.register_new_resolver("vlmtrain.gpus_per_node", _gpus_per_node)
    if not OmegaConf.has_resolver("vlmtrain.config_groups"):
        OmegaConf.register_new_resolver("vlmtrain.config_groups", _config_groups)
    if not OmegaConf.has_resolver("vlmtrain.override_dirname"):
        OmegaConf.register_new_resolver("vlmtrain.override_dirname", _override_dirname)


def register() -> None:
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    register_resolvers()


register_resolvers()  # also in processes that only unpickle configs (submitit jobs)
