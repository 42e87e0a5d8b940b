"""Fields Bridge leaves out of the ViT's TransformerConfig, copied in from the decoder's: vit_quantized (the number
format under precision.vision=quantized) and wgrad_fusion's gradient_accumulation_fusion.
"""

from __future__ import annotations

from typing import Any

from vlmtrain.train.bridge_patches.replace import replace

VIT_QUANTIZED_FIELDS = ("fp8", "fp8_recipe", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo",
                        "fp8_wgrad", "fp4", "fp4_recipe")
"""The decoder's number-format fields the ViT takes over under precision.vision=quantized (never fp8_param: the
ViT keeps BF16 weights, and never the BF16 first/last-layer counts, which index decoder layers)."""


def copy_into_vit_config(name: str, fields: tuple[str, ...]) -> None:
    """Bridge builds the ViT's TransformerConfig from scratch (get_vision_model_config) and copies only some of the
    decoder's fields into it; from now on `fields` are copied too (installed as `name`, wrapping any earlier copy)."""
    from megatron.bridge.models.qwen_vl import qwen35_vl_provider
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl import model

    for owner in (model, qwen35_vl_provider):
        original = owner.get_vision_model_config

        def get_vision_model_config(hf_config: Any, megatron_config: Any = None, original: Any = original) -> Any:
            config = original(hf_config, megatron_config=megatron_config)
            for field in fields:
                setattr(config, field, getattr(megatron_config, field))
            return config

        replace(f"{name}_{owner.__name__.rsplit('.', 1)[-1]}", owner, "get_vision_model_config",
                 get_vision_model_config)


def install_vit_quantized() -> None:
    """vit_quantized: the ViT takes the decoder's number format (Bridge's ViT runs BF16 under every recipe)."""
    copy_into_vit_config("vit_quantized", VIT_QUANTIZED_FIELDS)
