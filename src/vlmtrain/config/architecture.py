"""The architecture facts of the models vlmtrain builds, in one place: the model group builds the HF config from
them (config.groups.model.hf_config), and the memory estimate (check.memory) and the FLOP count (config.flops)
do their arithmetic on them.

- Families: Qwen3-VL and Qwen3.5 (`Family`), and Qwen3.5's Gated-DeltaNet shape (`LinearAttentionConfig`, the
  model group's `model.linear_attention`), declared here so that this module reads nothing of the model group at
  run time (the model group imports it).
- Vision: 16x16 px patches over 2 frames (a still image is repeated), 3 channels; a 2x2 spatial merge turns 4
  patches into one LLM token (32x32 px); a learned table of 2304 ViT positions.
- Decoder layer pattern: Qwen3-VL layers are all full (softmax) attention; Qwen3.5 layers are Gated-DeltaNet
  linear attention except every `full_attention_interval`-th (1-based), which is full attention, with the GDN
  shape of `model.linear_attention` (its defaults when unset, as the built model has).
- Layer widths: attention Q = heads x head_dim, K and V = KV heads x head_dim each, and Qwen3.5's output gate
  (Q wide); Gated-DeltaNet Q and K = key heads x key_head_dim, V = value heads x value_head_dim, a depthwise
  causal conv of width 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from vlmtrain.config.groups.model import ModelConfig

PATCH_SIZE = 16
"""ViT patch side in pixels."""
TEMPORAL_PATCH_SIZE = 2
"""Frames per ViT patch (an image is repeated to 2)."""
SPATIAL_MERGE_SIZE = 2
"""The patch merger joins 2x2 patches into one LLM token."""
PATCHES_PER_TOKEN = SPATIAL_MERGE_SIZE**2
"""ViT patches per LLM image token (4)."""
VIT_PATCH_INPUT = 3 * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE
"""Conv3d input per patch: 3 channels x temporal patch 2 x 16 x 16 px = 1536."""
VIT_POSITION_EMBEDDINGS = 2304
"""Learned ViT position table (num_position_embeddings in the HF config)."""
GDN_CONV_KERNEL = 4
"""Gated-DeltaNet depthwise causal conv width (linear_conv_kernel_dim, Qwen3.5 default)."""
QWEN35_PARTIAL_ROTARY_FACTOR = 0.25
"""Qwen3.5 rotates a quarter of head_dim (its mRoPE section sums to head_dim * 0.25 / 2)."""


class Family(StrEnum):
    """The model families vlmtrain builds (the model group's `family`)."""

    qwen3_vl = "qwen3_vl"
    qwen35_vl = "qwen35_vl"


@dataclass
class LinearAttentionConfig:
    """Gated-DeltaNet layers of Qwen3.5 (every `full_attention_interval`-th layer is full attention): the model
    group's `model.linear_attention`, its defaults the published shape."""

    full_attention_interval: int = 4
    key_head_dim: int = 128
    value_head_dim: int = 128
    num_key_heads: int = 16
    num_value_heads: int = 32


def vit_head_dim(m: ModelConfig) -> int:
    """Channels per ViT attention head (Qwen3-VL-30B-A3B / 235B-A22B: 1152 / 16 = 72)."""
    return m.vit.hidden_size // m.vit.num_heads


LayerType = Literal["linear_attention", "full_attention"]


def linear_attention(m: ModelConfig) -> LinearAttentionConfig | None:
    """The Gated-DeltaNet shape the model is built with: Qwen3.5 only, `model.linear_attention` or its defaults."""
    if m.family != Family.qwen35_vl:
        return None
    return m.linear_attention or LinearAttentionConfig()


def layer_gdn(m: ModelConfig, layer: int) -> LinearAttentionConfig | None:
    """The Gated-DeltaNet shape of decoder layer `layer` (0-based), None where it is full attention: Qwen3.5 layers
    are GDN except every `full_attention_interval`-th (1-based)."""
    la = linear_attention(m)
    return la if la is not None and (layer + 1) % la.full_attention_interval != 0 else None


def is_linear_attention(m: ModelConfig, layer: int) -> bool:
    return layer_gdn(m, layer) is not None


def layer_types(m: ModelConfig) -> list[LayerType]:
    """Every decoder layer's mixer, in HF's `layer_types` names."""
    return ["linear_attention" if is_linear_attention(m, i) else "full_attention" for i in range(m.num_layers)]


def has_output_gate(m: ModelConfig) -> bool:
    """Qwen3.5's full attention gates its output with a sigmoid of a Q-wide projection of the input."""
    return m.family == Family.qwen35_vl


def attention_widths(m: ModelConfig) -> tuple[int, int]:
    """(Q, K) projection widths of full attention: heads x head_dim and KV heads x head_dim (V is as wide as K)."""
    return m.num_attention_heads * m.head_dim, m.num_query_groups * m.head_dim


def gdn_widths(la: LinearAttentionConfig) -> tuple[int, int]:
    """(Q, V) projection widths of Gated-DeltaNet: key heads x key_head_dim (K is as wide as Q), value heads x
    value_head_dim."""
    return la.key_head_dim * la.num_key_heads, la.value_head_dim * la.num_value_heads
