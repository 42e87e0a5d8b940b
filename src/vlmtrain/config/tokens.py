"""Token bounds that the data stage applies and earlier stages (resolve, preflight, the memory estimate) reason
about: declared here, in stage 0, so `config/` never imports `data/`; `data/` imports them from here."""

from __future__ import annotations

from vlmtrain.config.architecture import PATCH_SIZE, SPATIAL_MERGE_SIZE

#: Pixels per side of one LLM token in Qwen3-VL (ViT patch x spatial merge: 32).
TOKEN_PX = PATCH_SIZE * SPATIAL_MERGE_SIZE
#: Bridge's `qwen2_5_collate_fn` passes min_pixels=200704 and max_pixels=1003520 to the processor, i.e.
#: 196..980 tokens of 32x32 px; images outside are resized there, so targets are clamped to this range.
COLLATE_MIN_TOKENS = 200704 // (TOKEN_PX * TOKEN_PX)
COLLATE_MAX_TOKENS = 1003520 // (TOKEN_PX * TOKEN_PX)
