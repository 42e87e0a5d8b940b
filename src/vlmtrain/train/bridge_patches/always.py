"""Always installed, whatever the groups say (`install_redaction`): Bridge writes the whole ConfigContainer next to
every checkpoint (checkpointing.save_checkpoint -> `cfg.to_yaml(<iter dir>/run_config.yaml)`), hands
`cfg.to_dict()` to W&B / MLflow / Comet as their run config, and prints the logger section's values at setup
(`log_non_default_values`), so a `+bridge.logger.comet_api_key` would land in all of them. The container keeps
the real value (Comet reads it); what those serialize is masked by vlmtrain.config.redact. Also always
(`install_sample_ids`): Bridge's DirectSFTDataset collate also returns its examples' sample indices
(vlmtrain.data.sample_ids), which the step counters take off the batch before Bridge's step sees it. A packed run's
dataset (vlmtrain.data.bins_dataset.BinDataset) is not a DirectSFTDataset: its collate puts the ids there itself.
Every process also drops Bridge's ungated MODEL_TFLOP/s print (bridge_patches.step_time, installed with these).
"""

from __future__ import annotations

from typing import Any

from vlmtrain.train.bridge_patches.replace import replace


def install_redaction() -> None:
    """ConfigContainer.to_dict (to_yaml, the trackers' config) and the setup log's value tables, secrets masked."""
    from megatron.bridge.training import config

    from vlmtrain.config import redact

    to_dict = config.ConfigContainer.to_dict
    key_values, non_defaults = config._get_key_config_values, config._get_non_default_values

    def redacted_to_dict(self: Any) -> dict[str, Any]:
        return redact.redact(to_dict(self))

    def redacted_key_values(config_obj: Any) -> dict[str, Any]:
        return redact.redact(key_values(config_obj))

    def redacted_non_defaults(config_obj: Any, mcore_class: type) -> dict[str, Any]:
        return redact.redact(non_defaults(config_obj, mcore_class))

    replace("redact_to_dict", config.ConfigContainer, "to_dict", redacted_to_dict)
    replace("redact_key_values", config, "_get_key_config_values", redacted_key_values)
    replace("redact_non_defaults", config, "_get_non_default_values", redacted_non_defaults)


def install_sample_ids() -> None:
    """Every DirectSFTDataset's collate_fn (what Bridge's loader uses) wrapped by data.sample_ids.with_sample_ids."""
    from megatron.bridge.data.datasets.direct_sft import DirectSFTDataset

    from vlmtrain.data.sample_ids import with_sample_ids

    init = DirectSFTDataset.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.collate_fn = with_sample_ids(self.collate_fn)

    replace("sample_ids", DirectSFTDataset, "__init__", __init__)

