"""Build: the run config -> Megatron Bridge's ConfigContainer. The only place groups meet Bridge.

A base container carries what no group decides (Adam, cosine schedule, NullTokenizer:
the processor tokenizes); then every group's `apply()` writes its OWNS fields (the model and data groups from
what the data stage prepared: the processor's token ids, the scanned source), then `+bridge.*` overrides go
through Bridge's own override parser. Finalization/validation is Bridge's `runtime_config_update()`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.config.groups import GROUPS, data, model
from vlmtrain.data import prepare
from vlmtrain.data.processor import vision_token_ids

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


def base_container(provider: Any) -> ConfigContainer:
    from megatron.bridge.training.config import (
        CheckpointConfig,
        ConfigContainer,
        DistributedDataParallelConfig,
        DistributedInitConfig,
        LoggerConfig,
        OptimizerConfig,
        RNGConfig,
        SchedulerConfig,
        TokenizerConfig,
        TrainingConfig,
        ValidationConfig,
    )

    return ConfigContainer(
        model=provider,
        train=TrainingConfig(
            train_iters=1, global_batch_size=1, micro_batch_size=1, manual_gc=True, manual_gc_interval=100
        ),
        validation=ValidationConfig(eval_interval=None, eval_iters=0),  # the train group: train.eval_interval
        optimizer=OptimizerConfig(
            optimizer="adam",
            lr=1e-4,
            min_lr=1e-5,
            weight_decay=0.1,
            bf16=True,
            adam_beta1=0.9,
            adam_beta2=0.95,
            adam_eps=1e-8,
            clip_grad=1.0,
            use_distributed_optimizer=True,
        ),
        scheduler=SchedulerConfig(
            lr_decay_style="cosine",
            start_weight_decay=0.033,
            end_weight_decay=0.033,
            weight_decay_incr_style="constant",
        ),
        ddp=DistributedDataParallelConfig(grad_reduce_in_fp32=True),  # NaN checks: the train group
        dataset=None,  # type: ignore[arg-type]  # the data group sets it
        logger=LoggerConfig(log_interval=1, log_throughput=False, timing_log_level=1),
        tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=provider.vocab_size),
        checkpoint=CheckpointConfig(fully_parallel_save=True),
        dist=DistributedInitConfig(),
        rng=RNGConfig(seed=1234),
        mixed_precision="bf16_mixed",  # the precision group replaces it
    )


def flatten_overrides(value: Any, prefix: str = "") -> list[str]:
    """{"model": {"x": 1}} -> ["model.x=1"], in Hydra override syntax for Bridge's parser."""
    if isinstance(value, dict):
        return [o for k, v in value.items() for o in flatten_overrides(v, f"{prefix}.{k}" if prefix else k)]
    return [f"{prefix}={json.dumps(value)}"]


def bridge_tree(run: RunConfig) -> dict[str, Any]:
    """The run's `+bridge.*` passthrough as a plain nested dict."""
    from omegaconf import OmegaConf

    if isinstance(run.bridge, dict):
        return run.bridge
    return OmegaConf.to_container(OmegaConf.create(run.bridge))  # type: ignore[return-value]


def bridge_overrides(run: RunConfig) -> list[str]:
    """`+bridge.model.x=1` -> ["model.x=1"]."""
    return flatten_overrides(bridge_tree(run))


@functools.cache
def _token_ids(processor: str) -> dict[str, int]:
    """The processor tokenizer's special-token ids; cached, since loading the 151k-token tokenizer takes seconds."""
    return vision_token_ids(Path(processor))


def build(run: RunConfig, res: Resolved) -> ConfigContainer:
    """The ConfigContainer this run trains with, before Bridge's finalization (`res`: the run's resolved values,
    which every group's apply() reads instead of deriving them again)."""
    proc = str(prepare.processor_dir(run))
    cfg = base_container(model.build_provider(run, _token_ids(proc)))
    for group in GROUPS:
        if group is not data:
            group.apply(run, res, cfg)
    prepared = prepare.prepare(run, res)  # the data scan: a cache hit where the launcher scanned before torchrun
    data.apply(run, res, cfg, proc, prepared.hf_source, prepared.energon_kwargs, prepared.packed_dataset(),
               prepared.validation)
    overrides = bridge_overrides(run)
    if overrides:
        from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

        process_config_with_overrides(cfg, cli_overrides=overrides)
    return cfg
