"""Drop-in replacements for eight Bridge / Megatron / TE hot spots that profiles found (the issue-9 best case's,
results/profile_h200x2.jsonl; vit_host_grid, vit_attention_pad, wgrad_fusion and expert_wgrad H1's,
results/profile_h200.jsonl; mask_grid_only the loader's, results/collate_cpu.jsonl): the same results, meant to be
faster.
The kernels group decides which (`replacements`); `install()` puts them in place once per training process, before
Bridge builds the model.

- rope_te: Bridge rotates q and k of packed (THD) rows, in the ViT and the decoder, with Megatron's unfused
  `_apply_rotary_pos_emb_bshd` (cos, sin, two multiplies, a chunk/cat rotate-half and an add; the ViT does it in
  fp32): 249 ms of forward kernels in the profiled step, 8 % of the GPU's busy time; the backward of those ops runs
  outside Python frames, so the profile cannot name its share. Bridge's freqs there are absolute, one row per
  token ([t, 1, 1, d]), which is exactly what TE's fused kernel applies to an sbhd tensor with s = t and b = 1.
  TE computes in fp32 and rounds once (the ViT path did the same; the decoder's bf16 path rounded each op), so the
  ViT's q and k go to it in bf16, without Bridge's fp32 round trip around it (four casts per layer; bit for bit the
  same outputs and gradients).
- vit_positions: `Qwen3VLVisionModel.fast_pos_embed_interpolate` builds Python lists of 4 indices and 4 weights per
  patch (~280k list items per micro-batch) and syncs once per image; `rot_pos_emb` launches ~10 tiny kernels per
  image. Here both build their index tensors on the host with tensor ops, rows already in the 2x2-merge order, and
  move them once: one embedding lookup, no per-image GPU work. Forward outputs are bit-identical
  (tests/unit/test_fastpaths.py runs Bridge's own methods beside these).
- pin_visual_inputs: Bridge's DataLoader pins batches (pin_memory=True), but torch only pins tensors, containers
  and objects with a `pin_memory()` method, and Bridge's GenericVisualInputs has none. Its pixel tensors
  (200-270 MB per micro-batch here) stayed pageable, so `.cuda(non_blocking=True)` ran as a blocking ~6 GB/s copy
  on the compute stream. The method added here lets the loader's pin thread pin them off the critical path.
- vit_host_grid: the ViT's image grid lives on the GPU, and Bridge reads it back piecemeal: its packed-sequence
  `max_seqlen` is a 0-d GPU tensor, which TE compares (`AttentionParams.__eq__`) and converts to an int in every
  attention layer, each a device sync (146 ms of GPU idle in results/profile_h200.jsonl's H1 step), and the
  tower's last line syncs once more (`.tolist()` of the split sizes) after queuing all 27 layers. Here the grid is
  read to the host once per forward, and the lengths are host ints (cu_seqlens copied to the GPU asynchronously).
  Not in kernels=fast: at H1 the ViT's span fell but the step did not (docs/measurements.md, "Host syncs at H1").
- mask_grid_only (the data loader's, not the GPU's): Bridge's packed Qwen collate builds each sample's assistant
  loss mask by rendering its chat template through the processor again, twice, for token ids only; each render
  resized, normalized and patchified every image (48 % of a worker's time per H1 row, results/collate_cpu.jsonl).
  During that call the image processor computes each image's grid alone (the same smart_resize), which is all
  the token ids depend on: the same masks, no pixels (tests/unit/test_fastpaths.py compares whole rows).

- wgrad_fusion: Bridge builds the model with gradient_accumulation_fusion off, since Megatron's non-TE linears (the
  ViT mergers, the output layer) then call APEX's fused_weight_gradient_mlp_cuda, absent here; so every weight
  gradient was written in BF16 and added to its FP32 main grad by Megatron's grad hook (72 ms of adds and 42 ms of
  GPU idle in the H1 step). Here kernels.apply turns the fusion on, the ViT's config (built from scratch by Bridge)
  takes it too, and those linears get TE's accumulating GEMM where they ask for APEX's.
- expert_wgrad: TE's GroupedLinear runs each MoE expert's weight gradient as its own cuBLAS GEMM (the token counts
  are ragged, which its CUTLASS grouped GEMM cannot take): 128 GEMMs per linear. vlmtrain.train.expert_wgrad runs
  them as torch grouped GEMMs instead (its docstring says how and what it leaves to TE).

Always installed, whatever the groups say (`install_redaction`): Bridge writes the whole ConfigContainer next to
every checkpoint (checkpointing.save_checkpoint -> `cfg.to_yaml(<iter dir>/run_config.yaml)`), hands
`cfg.to_dict()` to W&B / MLflow / Comet as their run config, and prints the logger section's values at setup
(`log_non_default_values`), so a `+bridge.logger.comet_api_key` would land in all of them. The container keeps
the real value (Comet reads it); what those serialize is masked by vlmtrain.config.redact. Also always
(`install_sample_ids`): Bridge's DirectSFTDataset collate also returns its examples' sample indices
(vlmtrain.data.sample_ids), which the step counters take off the batch before Bridge's step sees it. A packed run's
dataset (vlmtrain.data.bins_dataset.BinDataset) is not a DirectSFTDataset: its collate puts the ids there itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from vlmtrain.config.groups import kernels, precision

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig

_installed: dict[str, tuple[Any, str, Any]] = {}


def _replace(name: str, owner: Any, attr: str, new: Any) -> None:
    """Set owner.attr = new once per process, keeping the original for uninstall()."""
    if name not in _installed:
        _installed[name] = (owner, attr, owner.__dict__.get(attr))
        setattr(owner, attr, new)


def uninstall() -> None:
    """Restore every replaced attribute (tests), the latest first: two replacements may wrap one attribute."""
    for owner, attr, original in reversed(_installed.values()):
        if original is None:
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)
    _installed.clear()


def installed() -> list[str]:
    return sorted(_installed)


# --- rope_te ------------------------------------------------------------------------------------------------------


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

    _replace("rope_te", rope, "apply_rotary_pos_emb_thd_absolute", apply_rotary_pos_emb_thd_absolute)
    _replace("rope_te_absolute", rope, "apply_rotary_pos_emb_absolute", apply_rotary_pos_emb_absolute)
    _replace("rope_te_attention", attention, "apply_rotary_pos_emb_absolute", apply_rotary_pos_emb_absolute)


# --- vit_positions ------------------------------------------------------------------------------------------------


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

    _replace("vit_pos_embed", Qwen3VLVisionModel, "fast_pos_embed_interpolate", pos_embed_interpolate)
    _replace("vit_rot_pos_emb", Qwen3VLVisionModel, "rot_pos_emb", rot_pos_emb)


# --- pin_visual_inputs --------------------------------------------------------------------------------------------


def pin_memory(self: Any) -> Any:
    """GenericVisualInputs.pin_memory: a copy with every tensor field in pinned host memory."""
    import torch

    pinned = {f.name: v.pin_memory() for f in dataclasses.fields(self)
              if isinstance(v := getattr(self, f.name), torch.Tensor)}
    return dataclasses.replace(self, **pinned)


def install_pin_visual_inputs() -> None:
    from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

    _replace("pin_visual_inputs", GenericVisualInputs, "pin_memory", pin_memory)


# --- vit_host_grid ------------------------------------------------------------------------------------------------


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

    _replace("vit_host_grid_forward", Qwen3VLVisionModel, "forward", vit_forward)
    _replace("vit_host_grid_seqlens", Qwen3VLVisionModel, "build_packed_seq_params", packed_seq_params)


# --- mask_grid_only -----------------------------------------------------------------------------------------------


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

    _replace("mask_grid_only", collate_fn, "build_assistant_loss_mask", build_assistant_loss_mask)


# --- vit_attention_pad --------------------------------------------------------------------------------------------


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

    _replace("vit_attention_pad", Qwen3VLVisionModel, "__init__", __init__)


VIT_QUANTIZED_FIELDS = ("fp8", "fp8_recipe", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo",
                        "fp8_wgrad", "fp4", "fp4_recipe")
"""The decoder's number-format fields the ViT takes over under precision.vision=quantized (never fp8_param: the
ViT keeps BF16 weights, and never the BF16 first/last-layer counts, which index decoder layers)."""


def _copy_into_vit_config(name: str, fields: tuple[str, ...]) -> None:
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

        _replace(f"{name}_{owner.__name__.rsplit('.', 1)[-1]}", owner, "get_vision_model_config",
                 get_vision_model_config)


def install_vit_quantized() -> None:
    """vit_quantized: the ViT takes the decoder's number format (Bridge's ViT runs BF16 under every recipe)."""
    _copy_into_vit_config("vit_quantized", VIT_QUANTIZED_FIELDS)


# --- wgrad_fusion -------------------------------------------------------------------------------------------------


class TEWgradAccumulation:
    """What Megatron's non-TE linears (the ViT mergers, the output layer) call APEX's fused_weight_gradient_mlp_cuda
    for under gradient_accumulation_fusion, on TE's GEMM: main_grad += grad_output^T @ input, accumulated in
    main_grad's dtype by the GEMM itself, as TE's own linears do."""

    @staticmethod
    def wgrad_gemm_accum_fp32(total_input: Any, grad_output: Any, main_grad: Any) -> None:
        from transformer_engine.pytorch.cpp_extensions import general_gemm

        general_gemm(total_input, grad_output, out_dtype=main_grad.dtype, layout="NT", out=main_grad,
                     accumulate=True, grad=True)

    wgrad_gemm_accum_fp16 = wgrad_gemm_accum_fp32


def install_wgrad_fusion() -> None:
    """wgrad_fusion: weight gradients accumulate into the FP32 main grads inside their GEMMs
    (model.gradient_accumulation_fusion, which kernels.apply sets), in the ViT too, and without APEX."""
    from megatron.core.tensor_parallel import layers

    _replace("wgrad_fusion_apex", layers, "fused_weight_gradient_mlp_cuda", TEWgradAccumulation)
    _replace("wgrad_fusion_available", layers, "_grad_accum_fusion_available", True)
    _copy_into_vit_config("wgrad_fusion", ("gradient_accumulation_fusion",))


# --- expert_wgrad -------------------------------------------------------------------------------------------------


def install_expert_wgrad() -> None:
    """expert_wgrad: TE's GroupedLinear backward looks `general_grouped_gemm` up in its module when it runs; the
    experts' BF16 wgrads go to vlmtrain.train.expert_wgrad, everything else to TE's own."""
    from transformer_engine.pytorch.module import grouped_linear

    from vlmtrain.train.expert_wgrad import grouped

    _replace("expert_wgrad", grouped_linear, "general_grouped_gemm", grouped(grouped_linear.general_grouped_gemm))


# --- redaction (always) -------------------------------------------------------------------------------------------


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

    _replace("redact_to_dict", config.ConfigContainer, "to_dict", redacted_to_dict)
    _replace("redact_key_values", config, "_get_key_config_values", redacted_key_values)
    _replace("redact_non_defaults", config, "_get_non_default_values", redacted_non_defaults)


def install_sample_ids() -> None:
    """Every DirectSFTDataset's collate_fn (what Bridge's loader uses) wrapped by data.sample_ids.with_sample_ids."""
    from megatron.bridge.data.datasets.direct_sft import DirectSFTDataset

    from vlmtrain.data.sample_ids import with_sample_ids

    init = DirectSFTDataset.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.collate_fn = with_sample_ids(self.collate_fn)

    _replace("sample_ids", DirectSFTDataset, "__init__", __init__)


def install_always() -> None:
    """What every training process gets, whatever the groups say: redaction and sample ids."""
    install_redaction()
    install_sample_ids()


SAME_BATCHES = frozenset({"mask_grid_only"})
"""Replacements in the loader alone: every batch a rank receives is the same tensor for tensor (their tests say so),
so a preset with them trains what a measured case without them trained."""

INSTALL: dict[str, Callable[[RunConfig], None]] = {
    "rope_te": lambda run: install_rope_te(), "vit_positions": lambda run: install_vit_positions(),
    "pin_visual_inputs": lambda run: install_pin_visual_inputs(), "vit_host_grid": lambda run: install_vit_host_grid(),
    "vit_quantized": lambda run: install_vit_quantized(), "mask_grid_only": lambda run: install_mask_grid_only(),
    "vit_attention_pad": lambda run: install_vit_attention_pad(run.kernels.vit_attention_head_dim),
    "wgrad_fusion": lambda run: install_wgrad_fusion(), "expert_wgrad": lambda run: install_expert_wgrad()}
"""Each replacement's installer, given the run (only vit_attention_pad reads it: its head dim)."""


def install(run: RunConfig) -> list[str]:
    """Put the run's chosen code paths (kernels' and precision's replacements) in place in this training
    process; their names."""
    names = kernels.replacements(run) + precision.replacements(run)
    for name in names:
        INSTALL[name](run)
    return names
