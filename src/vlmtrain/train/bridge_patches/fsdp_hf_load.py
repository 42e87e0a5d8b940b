"""fsdp_hf_load: Bridge 0.6.2 cannot start a Megatron-FSDP run from Hugging Face weights (`model.hf_path`). Its
checkpoint loader unwraps the model with megatron.core's unwrap_model, which stops at MegatronFSDP (not one of
its wrapper classes), and hands that to load_weights_hf_to_megatron; the weights are copied into the shards, then
the bridge calls `m.module.install_optimized_model_weights()` as if `m` were the FSDP adapter, and `m.module` is
the Float16Module inside (AttributeError). Here the Float16Module of each MegatronFSDP passed in answers that call
with its MegatronFSDP's own method, for the duration of the load.
"""

from __future__ import annotations

from typing import Any

from vlmtrain.train.bridge_patches.replace import replace


def install_fsdp_hf_load() -> None:
    from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge
    from megatron.core.distributed.fsdp.src.megatron_fsdp import MegatronFSDP

    load = MegatronModelBridge.load_weights_hf_to_megatron

    def load_weights_hf_to_megatron(self: Any, hf_pretrained: Any, megatron_model: Any, *args: Any,
                                    **kwargs: Any) -> Any:
        chunks = megatron_model if isinstance(megatron_model, list) else [megatron_model]
        fsdp = [m for m in chunks if isinstance(m, MegatronFSDP)]
        for m in fsdp:
            m.module.install_optimized_model_weights = m.install_optimized_model_weights
        try:
            return load(self, hf_pretrained, megatron_model, *args, **kwargs)
        finally:
            for m in fsdp:
                del m.module.install_optimized_model_weights

    replace("fsdp_hf_load", MegatronModelBridge, "load_weights_hf_to_megatron", load_weights_hf_to_megatron)
