"""mask_grid_only (the data loader's, not the GPU's): Bridge's packed Qwen collate builds each sample's assistant loss
mask by rendering its chat template through the processor again, twice, for token ids only; each render resized,
normalized and patchified every image (48 % of a worker's time per packed row of 12288 tokens,
results/collate_cpu.jsonl). During that call the image processor computes each image's grid alone (the same
smart_resize), which is all the token ids depend on: the same masks, no pixels (tests/unit/test_bridge_patches.py
compares whole rows).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from vlmtrain.train.bridge_patches.replace import replace


def grid_only_preprocess(self: Any, images: list[Any], do_resize: bool, size: Any, patch_size: int, merge_size: int,
                         return_tensors: Any = None, **_: Any) -> Any:
    """Qwen2VLImageProcessor._preprocess reduced to what token ids need: each image's [1, h, w] grid of patches
    after the same smart_resize (no resize, normalization or patches; pixel_values empty)."""
    import torch
    from transformers.image_processing_utils import BatchFeature
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    grids = []
    for image in images:
        height, width = image.shape[-2:]
        if do_resize:
            height, width = smart_resize(height, width, factor=patch_size * merge_size,
                                         min_pixels=size.shortest_edge, max_pixels=size.longest_edge)
        grids.append([1, height // patch_size, width // patch_size])
    return BatchFeature(data={"pixel_values": torch.zeros(0), "image_grid_thw": torch.tensor(grids, dtype=torch.long)},
                        tensor_type=return_tensors)


@contextlib.contextmanager
def grid_only(processor: Any) -> Iterator[None]:
    """Within it, the processor's image processor computes grids only (one whose `_preprocess` is not the one
    grid_only_preprocess reduces is left as is)."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    images = getattr(processor, "image_processor", None)
    if getattr(type(images), "_preprocess", None) is not Qwen2VLImageProcessor._preprocess:
        yield
        return
    images._preprocess = grid_only_preprocess.__get__(images)
    try:
        yield
    finally:
        del images._preprocess


def install_mask_grid_only() -> None:
    from megatron.bridge.models.qwen_vl.data import collate_fn

    build = collate_fn.build_assistant_loss_mask

    def build_assistant_loss_mask(example: Any, input_ids: Any, processor: Any, *args: Any, **kwargs: Any) -> Any:
        with grid_only(processor):
            return build(example, input_ids, processor, *args, **kwargs)

    replace("mask_grid_only", collate_fn, "build_assistant_loss_mask", build_assistant_loss_mask)
