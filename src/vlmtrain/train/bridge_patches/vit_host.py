"""The ViT's inputs kept on the host: three replacements.

vit_positions: `Qwen3VLVisionModel.fast_pos_embed_interpolate` builds Python lists of 4 indices and 4 weights per
patch (~280k list items per micro-batch) and syncs once per image; `rot_pos_emb` launches ~10 tiny kernels per
image. Here both build their index tensors on the host with tensor ops, rows already in the 2x2-merge order, and
move them once: one embedding lookup, no per-image GPU work. Forward outputs are bit-identical
(tests/unit/test_bridge_patches.py runs Bridge's own methods beside these).

pin_visual_inputs: Bridge's DataLoader pins batches (pin_memory=True), but torch only pins tensors, containers
and objects with a `pin_memory()` method, and Bridge's GenericVisualInputs has none. Its pixel tensors
(200-270 MB per micro-batch here) stayed pageable, so `.cuda(non_blocking=True)` ran as a blocking ~6 GB/s copy
on the compute stream. The method added here lets the loader's pin thread pin them off the critical path.

vit_host_grid: the ViT's image grid lives on the GPU, and Bridge reads it back piecemeal: its packed-sequence
`max_seqlen` is a 0-d GPU tensor, which TE compares (`AttentionParams.__eq__`) and converts to an int in every
attention layer, each a device sync (146 ms of GPU idle in results/profile_h200.jsonl's one-H200 step), and the
tower's last line syncs once more (`.tolist()` of the split sizes) after queuing all 27 layers. Here the grid is
read to the host once per forward, and the lengths are host ints (cu_seqlens copied to the GPU asynchronously).
Not in kernels=fast: in that step the ViT's span fell but the step did not (docs/measurements.md: the ViT's host
syncs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vlmtrain.train.bridge_patches.replace import replace


def _grids(grid_thw: Any) -> list[tuple[int, int, int]]:
    """(frames, height, width) in patches per image; one device->host copy."""
    return [(int(t), int(h), int(w)) for t, h, w in grid_thw.tolist()]


def _merge_order(x: Any, h: int, w: int, m: int, frames: int) -> Any:
    """[k, h, w] per-patch rows -> [k, frames * h * w] in the ViT's order: m x m merge blocks, then frames."""
    k = x.shape[0]
    return x.view(k, h // m, m, w // m, m).permute(0, 1, 3, 2, 4).reshape(k, -1).repeat(1, frames)


def pos_embed_interpolate(self: Any, grid_thw: Any) -> Any:
    """Qwen3VLVisionModel.fast_pos_embed_interpolate with the bilinear indices/weights built as host tensors."""
    import torch

    n, m = self.num_grid_per_side, self.config.spatial_merge_size
    idx_parts, weight_parts = [], []
    for frames, h, w in _grids(grid_thw):
        h_idxs, w_idxs = torch.linspace(0, n - 1, h), torch.linspace(0, n - 1, w)
        h_floor, w_floor = h_idxs.int(), w_idxs.int()
        h_ceil, w_ceil = (h_floor + 1).clip(max=n - 1), (w_floor + 1).clip(max=n - 1)
        dh, dw = h_idxs - h_floor, w_idxs - w_floor
        base_h, base_h_ceil = h_floor * n, h_ceil * n
        idx = torch.stack([base_h[:, None] + w_floor[None], base_h[:, None] + w_ceil[None],
                           base_h_ceil[:, None] + w_floor[None], base_h_ceil[:, None] + w_ceil[None]])
        weight = torch.stack([(1 - dh)[:, None] * (1 - dw)[None], (1 - dh)[:, None] * dw[None],
                              dh[:, None] * (1 - dw)[None], dh[:, None] * dw[None]])
        idx_parts.append(_merge_order(idx, h, w, m, frames))
        weight_parts.append(_merge_order(weight, h, w, m, frames))
    table = self.pos_embed.weight
    idx = torch.cat(idx_parts, dim=1).long().to(table.device)
    weight = torch.cat(weight_parts, dim=1).to(table.dtype).to(table.device)
    pos_embeds = self.pos_embed(idx) * weight[:, :, None]
    return pos_embeds[0] + pos_embeds[1] + pos_embeds[2] + pos_embeds[3]


def rot_pos_emb(self: Any, grid_thw: Any) -> Any:
    """Qwen3VLVisionModel.rot_pos_emb with the (row, col) of every patch built as one host tensor."""
    import torch

    m = self.spatial_merge_size
    grids = _grids(grid_thw)
    freq_table = self.rotary_pos_emb(max(max(h, w) for _, h, w in grids))
    parts = []
    for frames, h, w in grids:
        rows = torch.arange(h).view(1, h, 1).expand(1, h, w)
        cols = torch.arange(w).view(1, 1, w).expand(1, h, w)
        parts.append(_merge_order(torch.cat([rows, cols]).contiguous(), h, w, m, frames))
    pos_ids = torch.cat(parts, dim=1).t().to(freq_table.device)
    return freq_table[pos_ids].flatten(1)


def install_vit_positions() -> None:
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

    replace("vit_pos_embed", Qwen3VLVisionModel, "fast_pos_embed_interpolate", pos_embed_interpolate)
    replace("vit_rot_pos_emb", Qwen3VLVisionModel, "rot_pos_emb", rot_pos_emb)




def pin_memory(self: Any) -> Any:
    """GenericVisualInputs.pin_memory: a copy with every tensor field in pinned host memory."""
    import torch

    pinned = {f.name: v.pin_memory() for f in dataclasses.fields(self)
              if isinstance(v := getattr(self, f.name), torch.Tensor)}
    return dataclasses.replace(self, **pinned)


def install_pin_visual_inputs() -> None:
    from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

    replace("pin_visual_inputs", GenericVisualInputs, "pin_memory", pin_memory)




def packed_seq_params(self: Any, grid_thw: Any) -> Any:
    """Qwen3VLVisionModel.build_packed_seq_params from host lengths: one sequence per frame, max_seqlen an int."""
    import itertools

    import torch
    from megatron.core.packed_seq_params import PackedSeqParams

    seqlens = [h * w for frames, h, w in _grids(grid_thw) for _ in range(frames)]
    device = self.pos_embed.weight.device
    cu = torch.tensor([0, *itertools.accumulate(seqlens)], dtype=torch.int32, pin_memory=device.type == "cuda")
    cu = cu.to(device, non_blocking=True)
    longest = max(seqlens)
    return PackedSeqParams(cu_seqlens_q=cu, cu_seqlens_kv=cu, qkv_format="thd", max_seqlen_q=longest,
                           max_seqlen_kv=longest)


def install_vit_host_grid() -> None:
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

    forward = Qwen3VLVisionModel.forward

    def vit_forward(self: Any, hidden_states: Any, grid_thw: Any, *args: Any, **kwargs: Any) -> Any:
        """Bridge's forward on a host copy of the grid (the one device->host read of this forward)."""
        return forward(self, hidden_states, grid_thw.cpu(), *args, **kwargs)

    replace("vit_host_grid_forward", Qwen3VLVisionModel, "forward", vit_forward)
    replace("vit_host_grid_seqlens", Qwen3VLVisionModel, "build_packed_seq_params", packed_seq_params)
