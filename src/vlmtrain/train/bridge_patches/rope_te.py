"""rope_te: Bridge rotates q and k of packed (THD) rows, in the ViT and the decoder, with Megatron's unfused
`_apply_rotary_pos_emb_bshd` (cos, sin, two multiplies, a chunk/cat rotate-half and an add; the ViT does it in
fp32): 249 ms of forward kernels in the profiled step, 8 % of the GPU's busy time; the backward of those ops runs
outside Python frames, so the profile cannot name its share. Bridge's freqs there are absolute, one row per
token ([t, 1, 1, d]), which is exactly what TE's fused kernel applies to an sbhd tensor with s = t and b = 1.
TE computes in fp32 and rounds once (the ViT path did the same; the decoder's bf16 path rounded each op), so the
ViT's q and k go to it in bf16, without Bridge's fp32 round trip around it (four casts per layer; bit for bit the
same outputs and gradients).
"""

from __future__ import annotations

from typing import Any

from vlmtrain.train.bridge_patches.replace import replace


def _one_freqs_row_per_token(t: Any, freqs: Any) -> bool:
    """Bridge's absolute freqs as TE's fused kernel reads them: [t, 1, 1, d], row i for token i of t [t, h, d]."""
    return freqs.dim() == 4 and freqs.shape[0] == t.shape[0] and freqs.shape[1:3] == (1, 1)


def _te_rope(t: Any, freqs: Any, interleaved: bool) -> Any:
    """TE's fused RoPE on [t, h, d] as an sbhd tensor with s = t, b = 1 (it computes in fp32, in t's dtype out)."""
    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb

    return apply_rotary_pos_emb(t[:, None], freqs, tensor_format="sbhd", interleaved=interleaved,
                                fused=True).squeeze(1)


def install_rope_te() -> None:
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl import attention, rope

    unfused_thd, unfused_absolute = rope.apply_rotary_pos_emb_thd_absolute, rope.apply_rotary_pos_emb_absolute

    def apply_rotary_pos_emb_thd_absolute(t: Any, cu_seqlens: Any, freqs: Any, rotary_interleaved: bool = False) -> Any:
        """TE's fused RoPE on [t, 1, h, d] with per-token freqs [t, 1, 1, d]; anything else goes to Bridge's."""
        if not _one_freqs_row_per_token(t, freqs):
            return unfused_thd(t, cu_seqlens, freqs, rotary_interleaved=rotary_interleaved)
        return _te_rope(t, freqs, rotary_interleaved)

    def apply_rotary_pos_emb_absolute(t: Any, freqs: Any, config: Any, cu_seqlens: Any = None) -> Any:
        """Packed rows straight to TE's kernel in t's dtype: it computes in fp32 and rounds once, which is what
        Bridge's fp32 round trip (apply_rotary_pos_emb_in_fp32, the ViT's) did around it, at four casts less."""
        if cu_seqlens is None or config.apply_rope_fusion or not _one_freqs_row_per_token(t, freqs):
            return unfused_absolute(t, freqs, config, cu_seqlens=cu_seqlens)
        return _te_rope(t, freqs, config.rotary_interleaved)

    replace("rope_te", rope, "apply_rotary_pos_emb_thd_absolute", apply_rotary_pos_emb_thd_absolute)
    replace("rope_te_absolute", rope, "apply_rotary_pos_emb_absolute", apply_rotary_pos_emb_absolute)
    replace("rope_te_attention", attention, "apply_rotary_pos_emb_absolute", apply_rotary_pos_emb_absolute)
