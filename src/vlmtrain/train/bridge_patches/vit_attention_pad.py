"""vit_attention_pad: every TE attention of the Qwen3-VL ViT runs at a padded head dim (kernels.vit_attention_head_dim):
q, k and v zero-padded per head, the output sliced back (`padded_heads`, which lab.micro.vit_attention times too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vlmtrain.train.bridge_patches.replace import replace


def padded_heads(attend: Callable[..., Any], own: int, dim: int) -> Callable[..., Any]:
    """`attend(query, key, value, ...)` on q, k, v zero-padded from `own` to `dim` channels per head; its output
    ([..., heads * dim] or [..., heads, dim]) sliced back to `own` channels per head, in the same layout."""
    import torch.nn.functional as F  # noqa: N812

    def padded(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        out = attend(*(F.pad(x, (0, dim - own)) for x in (query, key, value)), *args, **kwargs)
        return out.unflatten(-1, (-1, dim))[..., :own].flatten(-2)

    return padded


def pad_head_dim(attention: Any, dim: int) -> None:
    """Run this TE DotProductAttention at head dim `dim` (padded_heads around its forward). The softmax scale stays
    the one TE set from the module's own channels at construction."""
    own = attention.hidden_size_per_attention_head_k
    if attention.hidden_size_per_attention_head_v != own or dim < own:
        raise ValueError(f"pad_head_dim: heads of {own} (k) / {attention.hidden_size_per_attention_head_v} (v) "
                         f"channels cannot be padded to {dim}")
    if dim == own:
        return
    attention.hidden_size_per_attention_head_k = attention.hidden_size_per_attention_head_v = dim
    attention.forward = padded_heads(attention.forward, own, dim)


def install_vit_attention_pad(dim: int) -> None:
    """Every TE attention of each Qwen3-VL ViT built from now on runs at head dim `dim`."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel
    from transformer_engine.pytorch import DotProductAttention

    init = Qwen3VLVisionModel.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        for module in self.modules():
            if isinstance(module, DotProductAttention):
                pad_head_dim(module, dim)

    replace("vit_attention_pad", Qwen3VLVisionModel, "__init__", __init__)
