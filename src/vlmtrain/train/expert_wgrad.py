"""The MoE experts' weight gradients as a few grouped GEMMs instead of one cuBLAS GEMM per expert.

TE's GroupedLinear backward computes each expert's dW_e = dY_e^T X_e through `general_grouped_gemm` (layout NT). Its
CUTLASS grouped GEMM (NVTE_USE_CUTLASS_GROUPED_GEMM, kernels=fast) needs one K, a multiple of 128, for every group; a
wgrad's K is that expert's token count, ragged, so TE falls back to a cuBLAS GEMM per expert on several streams: 128
launches per linear, the largest GPU-idle site of the one-H200 profile (results/profile_h200.jsonl). Forward (TN) and
dgrad (NN) share K (the hidden sizes) and keep TE's CUTLASS path. `torch.nn.functional.grouped_mm` takes ragged K
(`offs`), so here the tokens of up to CHUNK_BYTES of output run as one kernel, whose BF16 result is added to (or copied
into) the gradients: a BF16 weight gradient added in FP32, as Megatron's grad hook does without gradient-accumulation
fusion (TE's per-expert GEMMs accumulate in FP32 inside the GEMM). Anything else, FP8 or quantized tensors, biases,
inputs that are not row slices of one tensor, goes to TE's function unchanged.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

CHUNK_BYTES = 256 * 2**20
"""BF16 output one grouped GEMM writes before it is added to the gradients (a bound on the temporary's memory)."""


def _stacked(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The one 2-D tensor whose consecutive row blocks `parts` are (torch.split's views), else None."""
    first = parts[0]
    cols, rows = first.shape[-1], 0
    for p in parts:
        if p.dim() != 2 or p.shape[1] != cols or (p.numel() and p.stride() != (cols, 1)):
            return None
        if p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr():
            return None
        if p.storage_offset() != first.storage_offset() + rows * cols:
            return None
        rows += p.shape[0]
    return first.as_strided((rows, cols), (cols, 1))


def _plain_bf16(tensors: list[Any]) -> bool:
    return all(type(t) is torch.Tensor and t.dtype == torch.bfloat16 for t in tensors)


def _consecutive(outs: list[torch.Tensor], step: int) -> bool:
    """Whether outs[i] starts `step` * i tensors after outs[0] in one storage (step -1: Megatron's grad buffer,
    which lays parameters out in reverse)."""
    n = outs[0].numel()
    return all(o.is_contiguous() and o.untyped_storage().data_ptr() == outs[0].untyped_storage().data_ptr()
               and o.storage_offset() == outs[0].storage_offset() + step * i * n for i, o in enumerate(outs))


def _write(outs: list[torch.Tensor], w: torch.Tensor, accumulate: bool) -> None:
    """outs[i] (+)= w[i], as one op over a stacked view where the outputs are consecutive."""
    shape, stride = (len(outs), *outs[0].shape), (outs[0].numel(), *outs[0].stride())
    if _consecutive(outs, 1):
        dst, src = outs[0].as_strided(shape, stride), w
    elif _consecutive(outs, -1):
        dst, src = outs[-1].as_strided(shape, stride), w.flip(0)
    else:
        for o, g in zip(outs, w.unbind(0), strict=True):
            o.add_(g) if accumulate else o.copy_(g)
        return
    dst.add_(src) if accumulate else dst.copy_(src)


def wgrad(x: torch.Tensor, dy: torch.Tensor, splits: list[int], outs: list[torch.Tensor], accumulate: bool) -> None:
    """outs[e] (+)= dy_e^T x_e for the row blocks of `splits` tokens each, in chunks of at most CHUNK_BYTES."""
    per_expert = max(1, CHUNK_BYTES // (outs[0].numel() * 2))
    starts = [0, *itertools.accumulate(splits)]
    for lo in range(0, len(splits), per_expert):
        hi = min(lo + per_expert, len(splits))
        a, b = starts[lo], starts[hi]
        offs = torch.tensor(starts[lo + 1:hi + 1], dtype=torch.int32).sub_(a)
        if x.is_cuda:
            offs = offs.pin_memory().to(x.device, non_blocking=True)
        w = torch.nn.functional.grouped_mm(dy[a:b].t(), x[a:b], offs=offs)
        for e in range(lo, hi):  # an expert without tokens has a zero gradient; the kernel need not write one
            if splits[e] == 0:
                w[e - lo].zero_()
        _write(outs[lo:hi], w, accumulate)


def grouped(original: Any) -> Any:
    """`general_grouped_gemm` that runs BF16 expert wgrads (layout NT, no bias) through `wgrad`."""

    def general_grouped_gemm(A: list[Any], B: list[Any], out: list[Any], quantization_params: list[Any],
                             out_dtype: Any, layout: str = "TN", m_splits: list[int] | None = None,
                             gelu: bool = False, grad: bool = False, accumulate: bool = False, bias: Any = None,
                             use_bias: bool = False, use_split_accumulator: bool = False, D_dtype: Any = None,
                             single_output: bool = False) -> Any:
        x = dy = None
        if (layout == "NT" and grad and not (gelu or use_bias or single_output) and D_dtype is None
                and m_splits is not None and len(A) == len(B) == len(out) == len(m_splits) > 0
                and all(q is None for q in quantization_params) and _plain_bf16(A) and _plain_bf16(B)
                and all(type(o) is torch.Tensor and o.shape == out[0].shape for o in out)
                and out[0].dtype in (torch.float32, torch.bfloat16)):
            x, dy = _stacked(A), _stacked(B)
        if (x is None or dy is None or not sum(m_splits)
                or any(a.shape[0] != m or b.shape[0] != m for a, b, m in zip(A, B, m_splits, strict=True))):
            return original(A, B, out, quantization_params, out_dtype, layout=layout, m_splits=m_splits, gelu=gelu,
                            grad=grad, accumulate=accumulate, bias=bias, use_bias=use_bias,
                            use_split_accumulator=use_split_accumulator, D_dtype=D_dtype,
                            single_output=single_output)
        wgrad(x, dy, list(m_splits), out, accumulate)
        return out, [None] * len(out), None

    general_grouped_gemm.original = original  # type: ignore[attr-defined]
    return general_grouped_gemm
