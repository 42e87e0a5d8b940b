"""vlmtrain.train.bridge_patches next to the Bridge code they replace: same outputs (CPU parts here, the TE kernel and
pinned memory in tests/gpu/test_bridge_patches_gpu.py), installed only by the kernels options that ask for them."""

from __future__ import annotations

import types

import pytest
import torch

from vlmtrain.config.compose import compose
from vlmtrain.config.resolve import resolve
from vlmtrain.train import bridge_patches

# (frames, height, width) in 16 px patches, as Qwen3-VL's processor emits them for the realistic data's image sizes
# (multiples of the 2x2 merge; 196..980 LLM tokens), plus a 2-frame video grid and a square one.
GRIDS = [[1, 28, 28], [1, 44, 90], [1, 62, 62], [2, 16, 24], [1, 90, 44], [1, 38, 104]]


@pytest.fixture
def vit() -> types.SimpleNamespace:
    """A stand-in `self` with exactly the attributes the two Qwen3VLVisionModel methods read, at the 30B-A3B ViT's
    sizes (48 x 48 learned position grid, hidden 1152, 16 heads, 2x2 merge). Bridge's rotary table module
    allocates on CUDA, so a CPU table with a distinct row per position stands in for it (both sides index it)."""
    torch.manual_seed(0)
    pos_embed = torch.nn.Embedding(48 * 48, 1152).to(torch.bfloat16)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 36, 2, dtype=torch.float32) / 36))
    return types.SimpleNamespace(
        num_grid_per_side=48, spatial_merge_size=2, config=types.SimpleNamespace(spatial_merge_size=2),
        pos_embed=pos_embed, rotary_pos_emb=lambda n: torch.outer(torch.arange(n, dtype=torch.float32), inv_freq),
    )


def test_vit_positions_are_bit_identical_to_bridge(vit: types.SimpleNamespace) -> None:
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

    grid = torch.tensor(GRIDS)
    for ours, bridge in ((bridge_patches.pos_embed_interpolate, Qwen3VLVisionModel.fast_pos_embed_interpolate),
                         (bridge_patches.rot_pos_emb, Qwen3VLVisionModel.rot_pos_emb)):
        got, want = ours(vit, grid), bridge(vit, grid)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got, want), ours.__name__


def test_vit_positions_gradient_matches_bridge(vit: types.SimpleNamespace) -> None:
    """The position table's gradient: same rows hit with the same weights, so equal up to summation order (in an
    fp32 table: a bf16 table's gradient rounds each of the thousands of additions per row in either order)."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

    vit.pos_embed.float()
    grid = torch.tensor(GRIDS)
    grads = []
    for fn in (bridge_patches.pos_embed_interpolate, Qwen3VLVisionModel.fast_pos_embed_interpolate):
        vit.pos_embed.weight.grad = None
        out = fn(vit, grid)
        (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads.append(vit.pos_embed.weight.grad.float())
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-5)
    assert grads[0].abs().sum() > 0


def test_vit_packed_seq_params_match_bridge_with_host_lengths(vit: types.SimpleNamespace) -> None:
    """The same cu_seqlens (one sequence per frame), and max_seqlen as a Python int where Bridge has a 0-d tensor
    (which TE compares and converts in every attention layer: a device sync each time on a GPU grid)."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

    grid = torch.tensor(GRIDS)
    ours, bridge = bridge_patches.packed_seq_params(vit, grid), Qwen3VLVisionModel.build_packed_seq_params(vit, grid)
    assert torch.equal(ours.cu_seqlens_q, bridge.cu_seqlens_q) and ours.cu_seqlens_q.dtype == torch.int32
    assert torch.equal(ours.cu_seqlens_kv, bridge.cu_seqlens_kv)
    assert isinstance(bridge.max_seqlen_q, torch.Tensor)
    assert type(ours.max_seqlen_q) is int and ours.max_seqlen_q == int(bridge.max_seqlen_q) == 44 * 90
    assert ours.max_seqlen_kv == ours.max_seqlen_q and ours.qkv_format == bridge.qkv_format == "thd"
    assert len(ours.cu_seqlens_q) == len(GRIDS) + 2  # the 2-frame grid is two sequences


def test_install_only_what_the_options_ask_and_uninstall_restores() -> None:
    from megatron.bridge.models.qwen_vl.data import collate_fn
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl import rope
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel
    from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

    originals = (rope.apply_rotary_pos_emb_thd_absolute, Qwen3VLVisionModel.rot_pos_emb)
    mask = collate_fn.build_assistant_loss_mask
    try:
        assert bridge_patches.install(compose(["kernels=default"])) == []
        assert rope.apply_rotary_pos_emb_thd_absolute is originals[0]
        assert not hasattr(GenericVisualInputs, "pin_memory")
        assert bridge_patches.install(compose(["kernels.vit_positions=vectorized"])) == ["vit_positions"]
        assert bridge_patches.installed() == ["vit_pos_embed", "vit_rot_pos_emb"]
        assert rope.apply_rotary_pos_emb_thd_absolute is originals[0]
        assert bridge_patches.install(compose(["kernels=fast", "kernels.vit_host_grid=true"])) == [
            "rope_te", "vit_positions", "pin_visual_inputs", "vit_host_grid", "mask_grid_only"]
        assert len(bridge_patches.installed()) == 9  # rope_te replaces three names: two in rope, one in attention
        assert rope.apply_rotary_pos_emb_thd_absolute is not originals[0]
        assert Qwen3VLVisionModel.rot_pos_emb is bridge_patches.rot_pos_emb
        assert GenericVisualInputs.pin_memory is bridge_patches.pin_memory
        assert Qwen3VLVisionModel.build_packed_seq_params is bridge_patches.packed_seq_params
        assert collate_fn.build_assistant_loss_mask is not mask
    finally:
        bridge_patches.uninstall()
    assert (rope.apply_rotary_pos_emb_thd_absolute, Qwen3VLVisionModel.rot_pos_emb) == originals
    assert collate_fn.build_assistant_loss_mask is mask
    assert not hasattr(GenericVisualInputs, "pin_memory")


def test_vit_attention_pad_installs_on_the_vit_s_constructor() -> None:
    """kernels.vit_attention_head_dim installs on the ViT's constructor only (the decoder's attention keeps its head
    dim), and uninstall restores it. TE builds its attention on CUDA only: the module itself in tests/gpu/."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

    init = Qwen3VLVisionModel.__init__
    try:
        assert bridge_patches.install(compose(["kernels.vit_attention_head_dim=128"])) == ["vit_attention_pad"]
        assert bridge_patches.installed() == ["vit_attention_pad"] and Qwen3VLVisionModel.__init__ is not init
    finally:
        bridge_patches.uninstall()
    assert Qwen3VLVisionModel.__init__ is init


def test_wgrad_fusion_reaches_the_vit_and_megatron_s_own_linears() -> None:
    """kernels.wgrad_fusion: the ViT's TransformerConfig, which Bridge builds from scratch, takes the decoder's
    gradient_accumulation_fusion (Bridge's own code builds it from the real provider), and Megatron's non-TE linears
    find TE's GEMM where they ask for APEX's extension; uninstall restores all of it."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl import model
    from megatron.core.tensor_parallel import layers

    from vlmtrain.build import container

    run = compose(["kernels.wgrad_fusion=true"])
    provider = container.build(run, resolve(run)).model
    assert provider.gradient_accumulation_fusion is True
    assert model.get_vision_model_config(provider.vision_config, megatron_config=provider
                                         ).gradient_accumulation_fusion is False  # Bridge's: never copied
    assert layers._grad_accum_fusion_available is False and not hasattr(layers, "fused_weight_gradient_mlp_cuda")
    try:
        assert bridge_patches.install(run) == ["wgrad_fusion"]
        vit = model.get_vision_model_config(provider.vision_config, megatron_config=provider)
        assert vit.gradient_accumulation_fusion is True and vit.hidden_size == run.model.vit.hidden_size
        assert layers._grad_accum_fusion_available is True
        assert layers.fused_weight_gradient_mlp_cuda is bridge_patches.TEWgradAccumulation
    finally:
        bridge_patches.uninstall()
    assert layers._grad_accum_fusion_available is False and not hasattr(layers, "fused_weight_gradient_mlp_cuda")
    assert model.get_vision_model_config(provider.vision_config, megatron_config=provider
                                         ).gradient_accumulation_fusion is False


def test_vit_config_copies_stack_and_unwind() -> None:
    """Two replacements wrap Bridge's get_vision_model_config (vit_quantized, wgrad_fusion): both copies apply, and
    uninstall unwinds them latest first, back to Bridge's function."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl import model

    original = model.get_vision_model_config
    try:
        bridge_patches.install_vit_quantized()
        bridge_patches.install_wgrad_fusion()
        assert model.get_vision_model_config is not original
    finally:
        bridge_patches.uninstall()
    assert model.get_vision_model_config is original


def test_rope_falls_back_to_bridge_unless_one_freqs_row_per_token() -> None:
    """Freqs that are not one row per token (here one row broadcast to all) keep Bridge's unfused path, which runs
    on CPU; the fused kernel reads row i for token i only."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl import rope

    unfused = rope.apply_rotary_pos_emb_thd_absolute
    t = torch.randn(6, 2, 8)
    freqs = torch.randn(1, 1, 1, 8)
    try:
        bridge_patches.install_rope_te()
        assert torch.equal(rope.apply_rotary_pos_emb_thd_absolute(t, None, freqs), unfused(t, None, freqs))
    finally:
        bridge_patches.uninstall()


def test_plan_names_the_replaced_code() -> None:
    from vlmtrain.build import plan

    def rendered(kernels: str) -> str:
        run = compose([f"kernels={kernels}"])
        return plan.render(run, resolve(run), None, [], "-")

    code = [line for line in rendered("fast").splitlines() if line.startswith("code:")]
    assert code and code[0].endswith("rope_te, vit_positions, pin_visual_inputs, mask_grid_only")
    assert "code:" not in rendered("default")
