"""vlmtrain.train.expert_wgrad beside per-expert GEMMs on real tensors (torch's grouped GEMM runs on the CPU too; TE's
GroupedLinear beside it on a GPU: tests/gpu/test_bridge_patches_gpu.py), and what it leaves to TE's function."""

from __future__ import annotations

import pytest
import torch

from vlmtrain.config.compose import compose
from vlmtrain.train import bridge_patches, expert_wgrad

SPLITS = [5, 0, 17, 3, 9, 0, 24]  # two experts without tokens
IN, OUT = 64, 32


def _inputs() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """x and dy of TE's wgrad as its backward passes them: torch.split views of one tensor each."""
    torch.manual_seed(0)
    x = torch.randn(sum(SPLITS), IN, dtype=torch.bfloat16)
    dy = torch.randn(sum(SPLITS), OUT, dtype=torch.bfloat16)
    return list(torch.split(x, SPLITS)), list(torch.split(dy, SPLITS))


def _per_expert(xs: list[torch.Tensor], dys: list[torch.Tensor]) -> list[torch.Tensor]:
    """What TE's per-expert GEMMs compute, rounded to BF16 as the grouped GEMM's output is."""
    return [(d.float().t() @ x.float()).bfloat16().float() for x, d in zip(xs, dys, strict=True)]


def _outputs(layout: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Per-expert gradient tensors as TE receives them: Megatron's grad buffer (experts in reverse order), TE's
    own packed buffer (in order), or unrelated tensors."""
    n = len(SPLITS)
    if layout == "separate":
        return [torch.full((OUT, IN), 0.5, dtype=dtype) for _ in range(n)]
    flat = torch.full((n, OUT, IN), 0.5, dtype=dtype)
    return [flat[n - 1 - e] if layout == "reversed" else flat[e] for e in range(n)]


@pytest.mark.parametrize("layout", ["reversed", "in_order", "separate"])
@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("chunk_bytes", [expert_wgrad.CHUNK_BYTES, 3 * OUT * IN * 2])  # one GEMM, then chunks of 3
def test_grouped_wgrad_matches_per_expert_gemms(monkeypatch: pytest.MonkeyPatch, layout: str, accumulate: bool,
                                                chunk_bytes: int) -> None:
    monkeypatch.setattr(expert_wgrad, "CHUNK_BYTES", chunk_bytes)
    xs, dys = _inputs()
    dtype = torch.float32 if accumulate else torch.bfloat16  # main grads under wgrad fusion, else TE's BF16 buffer
    outs = _outputs(layout, dtype)
    assert expert_wgrad._consecutive(outs, -1 if layout == "reversed" else 1) == (layout != "separate")
    te_calls: list[str] = []
    gemm = expert_wgrad.grouped(lambda *a, **k: te_calls.append(k["layout"]))
    returned, biases, _ = gemm(xs, dys, outs, [None] * len(SPLITS), torch.bfloat16, layout="NT", m_splits=SPLITS,
                               grad=True, accumulate=accumulate)
    assert te_calls == [] and returned is outs and biases == [None] * len(SPLITS)
    for e, (got, want) in enumerate(zip(outs, _per_expert(xs, dys), strict=True)):
        want = want + 0.5 if accumulate else want.bfloat16()
        torch.testing.assert_close(got, want.to(dtype), rtol=1e-2, atol=1e-2, msg=f"expert {e}")
        if SPLITS[e] == 0:
            assert torch.all(got == (0.5 if accumulate else 0.0))
    assert outs[2].abs().max() > 1  # a real gradient landed, not the fill


def test_everything_else_goes_to_te_unchanged() -> None:
    """Forward and dgrad layouts, quantizers, biases, single outputs, inputs that are not slices of one tensor."""
    xs, dys = _inputs()
    outs = _outputs("in_order", torch.bfloat16)
    calls: list[tuple[str, bool]] = []
    gemm = expert_wgrad.grouped(lambda A, B, out, q, dtype, **k: calls.append((k["layout"], k["use_bias"])))
    none = [None] * len(SPLITS)
    gemm(xs, dys, outs, none, torch.bfloat16, layout="TN", m_splits=SPLITS)
    gemm(xs, dys, outs, none, torch.bfloat16, layout="NN", m_splits=SPLITS, grad=True)
    gemm(xs, dys, outs, [object()] * len(SPLITS), torch.bfloat16, layout="NT", m_splits=SPLITS, grad=True)
    gemm(xs, dys, outs, none, torch.bfloat16, layout="NT", m_splits=SPLITS, grad=True, use_bias=True)
    gemm(xs, dys, outs, none, torch.bfloat16, layout="NT", m_splits=SPLITS, grad=True, single_output=True)
    gemm([x.clone() for x in xs], dys, outs, none, torch.bfloat16, layout="NT", m_splits=SPLITS, grad=True)
    gemm([x.float() for x in xs], [d.float() for d in dys], outs, none, torch.bfloat16, layout="NT",
         m_splits=SPLITS, grad=True)
    assert calls == [("TN", False), ("NN", False), ("NT", False), ("NT", True), ("NT", False), ("NT", False),
                     ("NT", False)]
    assert all(torch.all(o == 0.5) for o in outs)  # none of them wrote a gradient itself


def test_installed_on_te_grouped_linear_only_when_asked() -> None:
    from transformer_engine.pytorch.module import grouped_linear

    original = grouped_linear.general_grouped_gemm
    try:
        assert "expert_wgrad" not in bridge_patches.install(compose(["kernels=fast"]))
        assert grouped_linear.general_grouped_gemm is original
        assert bridge_patches.install(compose(["kernels.expert_wgrad=grouped"])) == ["expert_wgrad"]
        assert grouped_linear.general_grouped_gemm.original is original
    finally:
        bridge_patches.uninstall()
    assert grouped_linear.general_grouped_gemm is original
