"""vlmtrain.train.bridge_patches' GPU parts beside Bridge's code: TE's fused RoPE against Bridge's unfused rotation on
packed rows at the 30B-A3B ViT's and decoder's head shapes (forward and gradient), pinned visual inputs, the ViT's
attention at a padded head dim (TE's own module beside it, and in real training) and the ViT's host grid in real
training, the ViT's rope in bf16, weight-gradient accumulation in the GEMM and the experts' grouped wgrad (alone
and in real training, the latter with the precision-aware optimizer). Run with `pytest -m gpu`."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from vlmtrain.lab.checks.resume import losses
from vlmtrain.lab.kit import runner
from vlmtrain.lab.kit.baselines import TINY, steps
from vlmtrain.lab.kit.case import Case
from vlmtrain.train import bridge_patches

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


# (tokens, heads, head dim, Bridge's apply_rotary_pos_emb_in_fp32): the ViT (16 x 72, fp32 rotation) and the
# decoder (32 query heads x 128) of Qwen3-VL-30B-A3B, on a packed row of several images / samples.
SHAPES = {"vit": (9000, 16, 72, True), "decoder": (5000, 32, 128, False)}


@pytest.mark.parametrize("part", SHAPES)
def test_te_rope_matches_bridge(part: str) -> None:
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl import rope

    tokens, heads, dim, in_fp32 = SHAPES[part]
    config = types.SimpleNamespace(apply_rope_fusion=False, apply_rotary_pos_emb_in_fp32=in_fp32,
                                   rotary_interleaved=False)
    torch.manual_seed(0)
    t = torch.randn(tokens, heads, dim, device="cuda", dtype=torch.bfloat16)
    # absolute per-token angles, as Bridge builds them (positions restart per image/sample)
    pos = torch.cat([torch.arange(n, device="cuda") for n in (tokens // 3, tokens // 3, tokens - 2 * (tokens // 3))])
    inv = 1.0 / (10000 ** (torch.arange(0, dim // 2, device="cuda", dtype=torch.float32) * 2 / dim))
    freqs = torch.outer(pos.float(), inv).repeat(1, 2).view(tokens, 1, 1, dim)
    cu = torch.tensor([0, tokens // 3, 2 * (tokens // 3), tokens], device="cuda", dtype=torch.int32)
    grad_out = torch.randn_like(t)

    outs = []
    for fused in (False, True):
        if fused:
            bridge_patches.install_rope_te()
        try:
            x = t.clone().requires_grad_()
            y = rope.apply_rotary_pos_emb_absolute(x, freqs, config, cu_seqlens=cu)
            y.backward(grad_out)
            outs.append((y.detach().float(), x.grad.float()))
        finally:
            bridge_patches.uninstall()
    (y0, g0), (y1, g1) = outs
    # bf16 outputs: both compute in fp32 for the ViT (one rounding); the decoder's unfused path rounds every op
    tol = {"vit": 1e-2, "decoder": 3e-2}[part]
    torch.testing.assert_close(y1, y0, rtol=tol, atol=tol)
    torch.testing.assert_close(g1, g0, rtol=tol, atol=tol)
    assert (y1 - t.float()).abs().max() > 0.1  # the rotation did something


def tiny_curves(tmp_path: Path, replacement: str, off: list[str], on: list[str],
                base: tuple[str, ...] = ()) -> tuple[dict[int, float], dict[int, float]]:
    """The tiny model's 4-step loss curves through train.py with kernels=fast, `off` and then `on` added; the replaced
    code `replacement` is in the on-run's list of replaced code only. Both curves hold steps 0-3."""
    curves = []
    for label, extra in (("off", off), ("on", on)):
        case = Case(f"tiny_{replacement}-{label}", 1, [*TINY, *steps(4, 4), "kernels=fast", *base, *extra],
                    dry_run=False)
        run = runner.start(case, tmp_path / label, fresh=True)
        assert run.wait() == 0, run.log.read_text()[-6000:]
        assert (replacement in (tmp_path / label / "ranks.log").read_text()) == (label == "on")  # replaced code
        curves.append(losses(tmp_path / label))
    assert sorted(curves[0]) == sorted(curves[1]) == [0, 1, 2, 3]
    return curves[0], curves[1]


def test_pinned_visual_inputs() -> None:
    from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs
    from torch.utils.data._utils.pin_memory import pin_memory

    vi = GenericVisualInputs(pixel_values=torch.randn(64, 1536), image_grid_thw=torch.tensor([[1, 8, 8]]))
    try:
        assert not pin_memory(vi).pixel_values.is_pinned()  # Bridge's own object: the loader leaves it pageable
        bridge_patches.install_pin_visual_inputs()
        pinned = pin_memory(vi)  # what DataLoader(pin_memory=True)'s pin thread calls on each batch value
    finally:
        bridge_patches.uninstall()
    assert isinstance(pinned, GenericVisualInputs)
    assert pinned.pixel_values.is_pinned() and pinned.image_grid_thw.is_pinned()
    assert pinned.pixel_values_videos is None
    assert torch.equal(pinned.pixel_values, vi.pixel_values)


def test_vit_host_grid_trains_the_same_losses(tmp_path: Path) -> None:
    """train.py with kernels=fast, with and without the ViT's host grid: the same samples from the same init give the
    same first loss (the forward is the same computation: same lengths, same kernels) and the same curve after."""
    off, on = tiny_curves(tmp_path, "vit_host_grid", ["kernels.vit_host_grid=false"], ["kernels.vit_host_grid=true"])
    assert on[0] == off[0]
    for step in range(1, 4):
        assert abs(on[step] - off[step]) < 1e-3, (step, off, on)


@pytest.mark.parametrize("dim", [80, 128])
def test_padded_vit_attention_matches_te_at_72(dim: int) -> None:
    """Megatron's TE attention as the 30B-A3B ViT builds it (16 heads of 72, thd rows of several images), run at a
    padded head dim: the same outputs and q/k/v gradients as at 72, within bf16 rounding of two kernels."""
    import math

    from transformer_engine.pytorch import DotProductAttention

    lengths = [3136, 784, 2304, 1600]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    torch.manual_seed(0)
    q, k, v, grad = (torch.randn(sum(lengths), 16, 72, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    with pytest.raises(ValueError, match="cannot be padded to 64"):
        bridge_patches.pad_head_dim(DotProductAttention(16, 72, qkv_format="thd"), 64)
    results = []
    for pad in (None, dim):
        attn = DotProductAttention(16, 72, qkv_format="thd", attn_mask_type="padding", attention_dropout=0.0)
        if pad:
            bridge_patches.pad_head_dim(attn, pad)
            assert (attn.hidden_size_per_attention_head_k, attn.hidden_size_per_attention_head_v) == (pad, pad)
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attn(*x, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))
        assert out.shape == (sum(lengths), 16 * 72)
        out.backward(grad.flatten(-2))
        results.append([out.detach().float(), *(t.grad.float() for t in x)])
        assert attn.softmax_scale == pytest.approx(1 / math.sqrt(72))
    for padded, plain in zip(*results, strict=True):
        torch.testing.assert_close(padded, plain, rtol=2e-2, atol=2e-2)
    assert results[0][0].abs().max() > 0.1 and results[0][3].abs().max() > 0.1  # outputs and gradients not zero


def test_padded_vit_attention_trains_the_same_losses(tmp_path: Path) -> None:
    """train.py with kernels=fast, the tiny ViT's heads (64 channels) at 64 and padded to 128: the same samples from
    the same init, the same first loss within kernel rounding and the same curve after."""
    off, on = tiny_curves(tmp_path, "vit_attention_pad", ["kernels.vit_attention_head_dim=null"],
                          ["kernels.vit_attention_head_dim=128"])
    for step in range(4):
        assert abs(on[step] - off[step]) < 1e-2, (step, off, on)


def test_vit_rope_in_bf16_is_the_fp32_round_trip() -> None:
    """kernels.rope=te hands the ViT's bf16 q/k to TE's kernel directly, without Bridge's fp32 round trip
    (apply_rotary_pos_emb_in_fp32) around it: the kernel computes in fp32 and rounds once either way, so outputs
    and gradients are bit for bit those of the round trip."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl import rope

    tokens, heads, dim, _ = SHAPES["vit"]
    config = types.SimpleNamespace(apply_rope_fusion=False, apply_rotary_pos_emb_in_fp32=True,
                                   rotary_interleaved=False)
    torch.manual_seed(0)
    t = torch.randn(tokens, heads, dim, device="cuda", dtype=torch.bfloat16)
    freqs = torch.outer(torch.arange(tokens, device="cuda").float() % 97,
                        torch.rand(dim // 2, device="cuda")).repeat(1, 2).view(tokens, 1, 1, dim)
    cu = torch.tensor([0, tokens], device="cuda", dtype=torch.int32)
    grad_out = torch.randn_like(t)

    x0 = t.clone().requires_grad_()
    y0 = bridge_patches._te_rope(x0.float(), freqs, False).to(torch.bfloat16)  # the round trip, fused inside
    y0.backward(grad_out)
    try:
        bridge_patches.install_rope_te()
        x1 = t.clone().requires_grad_()
        y1 = rope.apply_rotary_pos_emb_absolute(x1, freqs, config, cu_seqlens=cu)
        y1.backward(grad_out)
    finally:
        bridge_patches.uninstall()
    assert y1.dtype == torch.bfloat16 and torch.equal(y1, y0) and torch.equal(x1.grad, x0.grad)
    assert (y1.float() - t.float()).abs().max() > 0.1  # the rotation did something


def test_te_wgrad_accumulation_adds_grad_output_t_input() -> None:
    """What Megatron's non-TE linears call under kernels.wgrad_fusion: main_grad += grad_output^T @ input, in FP32,
    twice (two micro-batches), against the same sum in FP32 torch."""
    torch.manual_seed(0)
    inp = [torch.randn(3000, 1152, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    gout = [torch.randn(3000, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    main_grad = torch.randn(2048, 1152, device="cuda", dtype=torch.float32)
    want = main_grad + sum(g.float().t() @ x.float() for g, x in zip(gout, inp, strict=True))
    for x, g in zip(inp, gout, strict=True):
        bridge_patches.TEWgradAccumulation.wgrad_gemm_accum_fp32(x, g, main_grad)
    torch.testing.assert_close(main_grad, want, rtol=1e-3, atol=1e-2)


def test_wgrad_fusion_trains_the_same_losses(tmp_path: Path) -> None:
    """train.py with kernels=fast under parallelism=3d (what H1 runs), then with kernels.wgrad_fusion (and the
    non-finite check at the step's end, as experiment=perf_h200_best has both): the same first loss (the forward is
    the same) and the same curve after, within the rounding of a BF16 gradient added in FP32 against FP32
    accumulation in the GEMM."""
    off, on = tiny_curves(tmp_path, "wgrad_fusion", [], ["kernels.wgrad_fusion=true",
                                                         "train.on_nonfinite=stop_at_step_end"],
                          base=("parallelism=3d",))
    assert on[0] == off[0]
    for step in range(1, 4):
        assert abs(on[step] - off[step]) < 1e-2, (step, off, on)


@pytest.mark.parametrize("fused", [False, True])
def test_grouped_expert_wgrad_matches_te_grouped_linear(monkeypatch: pytest.MonkeyPatch, fused: bool) -> None:
    """TE's GroupedLinear at the 30B-A3B experts' fc1 shape (2048 -> 2 x 768), 128 experts with ragged token counts
    (some without tokens), its weight gradients with TE's per-expert GEMMs and then with kernels.expert_wgrad:
    equal within BF16 rounding, in TE's BF16 gradients and in FP32 main grads laid out as Megatron's buffer does
    (experts in reverse order) with two micro-batches accumulated."""
    import transformer_engine.pytorch as te

    from vlmtrain.train import expert_wgrad

    torch.manual_seed(0)
    experts, hidden, ffn = 128, 2048, 1536
    splits = torch.randint(0, 96, (experts,)).tolist()
    splits[3] = splits[77] = 0
    layer = te.GroupedLinear(experts, hidden, ffn, bias=False, params_dtype=torch.bfloat16,
                             fuse_wgrad_accumulation=fused)
    weights = [getattr(layer, f"weight{e}") for e in range(experts)]
    inputs = [torch.randn(sum(splits), hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    grads = [torch.randn(sum(splits), ffn, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    calls = []
    monkeypatch.setattr(expert_wgrad, "wgrad", lambda *a, wgrad=expert_wgrad.wgrad: calls.append(1) or wgrad(*a))

    def weight_grads() -> list[torch.Tensor]:
        buffer = torch.zeros(experts, ffn, hidden, device="cuda")
        for e, w in enumerate(weights):
            w.grad, w.main_grad = None, buffer[experts - 1 - e]
        for x, g in zip(inputs, grads, strict=True):
            layer(x.requires_grad_(), splits, is_first_microbatch=None).backward(g)
        return [(w.main_grad if fused else w.grad).float().clone() for w in weights]

    te_grads = weight_grads()
    try:
        bridge_patches.install_expert_wgrad()
        ours = weight_grads()
    finally:
        bridge_patches.uninstall()
    assert len(calls) == 2  # one per backward, each a few grouped GEMMs
    for e, (got, want) in enumerate(zip(ours, te_grads, strict=True)):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2, msg=f"expert {e}")
        assert (got.abs().max() == 0) == (splits[e] == 0), e


def test_expert_wgrad_and_precision_aware_optimizer_train_the_same_losses(tmp_path: Path) -> None:
    """train.py under parallelism=3d, then with the grouped expert wgrad and TE's precision-aware Adam: the same first
    loss (the forward is the same) and the same curve after, within the rounding of the experts' BF16 gradients (the
    Adam math is FP32 on both sides). Unfused: preflight refuses the grouped wgrad with kernels.wgrad_fusion."""
    base = ("parallelism=3d",)
    off, on = tiny_curves(tmp_path, "expert_wgrad", [], ["kernels.expert_wgrad=grouped",
                                                         "precision.precision_aware_optimizer=true"], base=base)
    assert on[0] == off[0]
    for step in range(1, 4):
        assert abs(on[step] - off[step]) < 1e-2, (step, off, on)
