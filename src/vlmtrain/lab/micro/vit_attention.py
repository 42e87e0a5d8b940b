"""The ViT's attention at benchmark H1's shapes, alone: which kernel runs it fastest on this card. The H1 profile
(results/profile_h200.jsonl) put attention at 909 of the step's 2416 GPU-busy ms, most of it the ViT's cuDNN
backward (454 ms, and 273 ms in its `compute_dot_do_o` pre-pass); this times the candidates on the same packed
shapes before any of them goes into the model.

Shapes: one H1 micro-batch's images, as data=realistic draws them (conf/data/realistic.yaml: 196..980 LLM tokens
per image, uniform, seed 0) until `image_tokens` (10.5k, the image share of a 12288-token row), 4 patches per LLM
token (2x2 merge), one attention sequence per image; Qwen3-VL-30B-A3B's ViT: 16 heads of 72. Variants (each skipped
where its library is missing, and said so):
- te_fused: TE's DotProductAttention, thd, padding mask, int max_seqlen: what Bridge's ViT runs (cuDNN on Hopper);
- te_fused_pad<D>: the same through vlmtrain.train.bridge_patches.pad_head_dim, what kernels.vit_attention_head_dim
  runs in training: q, k, v zero-padded to head dim D (80, 96, 128), the output sliced back, the softmax scale kept at
  1/sqrt(72); exact (zero dims add nothing to q.k and give zero outputs); it pays off where the kernel at D runs
  faster than at 72 by more than the FLOPs and copies the padding adds;
- torch_varlen: torch.nn.attention.varlen.varlen_attn (PyTorch's built-in FlashAttention-2 kernels), same cu_seqlens;
  torch_varlen_pad<D> the same, padded by the same code (bridge_patches.padded_heads);
- torch_sdpa_per_image: scaled_dot_product_attention per image ([1, heads, s, 72]), PyTorch's backend choice.
Each is timed as forward + backward over `iters` calls between CUDA events, `repeats` times after warm-up (median,
min-max); FLOPs count the forward's two matmuls (4 s^2 h d per image) and a backward of twice that. Outputs are
compared with the first variant's (max abs difference), so a fast wrong kernel shows.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import random
import statistics
import sys
from collections.abc import Callable
from typing import Any

from vlmtrain.lab.kit import experiments, store

HEADS, HEAD_DIM, VIT_LAYERS, MICRO_BATCHES = 16, 72, 27, 4
"""Qwen3-VL-30B-A3B's ViT, and H1's micro-batches per step (GBS 4 rows)."""


def seqlens(image_tokens: int = 10_500, lo: int = 196, hi: int = 980, patches_per_token: int = 4,
            seed: int = 0) -> list[int]:
    """ViT sequence lengths (patches) of one micro-batch's images."""
    rng, out, total = random.Random(seed), [], 0
    while total < image_tokens:
        n = rng.randint(lo, hi)
        out.append(n * patches_per_token)
        total += n
    return out


def flops(lengths: list[int], heads: int = HEADS, dim: int = HEAD_DIM) -> float:
    """Forward + backward FLOPs of one attention call over these sequences."""
    return 3 * sum(4.0 * s * s * heads * dim for s in lengths)


def _inputs(lengths: list[int]) -> dict[str, Any]:
    import torch

    t = sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, grad = (torch.randn(t, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
                     for _ in range(4))
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    return {"q": q, "k": k, "v": v, "grad": grad, "cu": cu, "max": max(lengths), "lengths": lengths}


def te_fused(dim: int = HEAD_DIM) -> Callable[..., Any]:
    """TE's attention as the ViT builds it, at `dim` through the training code's own padding (bridge_patches)."""
    from transformer_engine.pytorch import DotProductAttention

    from vlmtrain.train import bridge_patches

    dpa = DotProductAttention(HEADS, HEAD_DIM, qkv_format="thd", attn_mask_type="padding", attention_dropout=0.0)
    bridge_patches.pad_head_dim(dpa, dim)

    def run(q: Any, k: Any, v: Any, cu: Any, mx: int, lengths: list[int]) -> Any:
        return dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=mx, max_seqlen_kv=mx).view(q.shape)

    return run


def torch_varlen(dim: int = HEAD_DIM) -> Callable[..., Any]:
    import math

    from torch.nn.attention.varlen import varlen_attn

    from vlmtrain.train import bridge_patches

    attend = functools.partial(varlen_attn, scale=1.0 / math.sqrt(HEAD_DIM))
    attend = bridge_patches.padded_heads(attend, HEAD_DIM, dim) if dim != HEAD_DIM else attend

    def run(q: Any, k: Any, v: Any, cu: Any, mx: int, lengths: list[int]) -> Any:
        return attend(q, k, v, cu, cu, mx, mx)

    return run


def torch_sdpa_per_image() -> Callable[..., Any]:
    import torch
    import torch.nn.functional as F  # noqa: N812

    def run(q: Any, k: Any, v: Any, cu: Any, mx: int, lengths: list[int]) -> Any:
        outs = [F.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in parts))[0].transpose(0, 1)
                for parts in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True)]
        return torch.cat(outs)

    return run


VARIANTS: dict[str, Callable[[], Callable[..., Any]]] = {
    "te_fused": te_fused, "torch_varlen": torch_varlen, "torch_sdpa_per_image": torch_sdpa_per_image,
    **{f"te_fused_pad{d}": functools.partial(te_fused, d) for d in (80, 96, 128)},
    **{f"torch_varlen_pad{d}": functools.partial(torch_varlen, d) for d in (96, 128)}}


def time_variant(run: Callable[..., Any], x: dict[str, Any], repeats: int, iters: int) -> tuple[list[float], Any]:
    """ms per forward + backward call, one value per timed repeat; and the forward's output."""
    import torch

    q, k, v = (x[n].detach().requires_grad_() for n in "qkv")

    def once() -> Any:
        out = run(q, k, v, x["cu"], x["max"], x["lengths"])
        out.backward(x["grad"])
        return out

    for _ in range(3):
        out = once()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            once()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return times, out.detach()


def measure(names: list[str], repeats: int, iters: int, lengths: list[int]) -> list[tuple[str, dict[str, Any]]]:
    """(variant, metrics) for each variant that could run here; a missing library gives {"skipped": why}."""
    from vlmtrain.lab.kit import schedule as rep

    x, fl, rows, first = _inputs(lengths), flops(lengths), [], None
    for name in names:
        try:
            run = VARIANTS[name]()
        except ImportError as e:
            rows.append((name, {"skipped": f"{type(e).__name__}: {e}"}))
            continue
        times, out = time_variant(run, x, repeats, iters)
        ms = statistics.median(times)
        diff = 0.0 if first is None else float((out.float() - first.float()).abs().max())
        first = out if first is None else first
        rows.append((name, {**rep.spread(times, "fwd_bwd_ms"), "tflops_per_s": fl / (ms / 1e3) / 1e12,
                            "per_step_ms": ms * VIT_LAYERS * MICRO_BATCHES, "max_abs_diff_vs_first": diff,
                            "repeats": repeats, "iters": iters}))
    return rows


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--repeats", type=experiments.at_least(3, "a median needs them"), default=5,
                    help="timed repeats per variant (median and min-max)")
    ap.add_argument("--iters", type=int, default=10, help="forward + backward calls per timed repeat")
    experiments.add_results(ap, "vit_attention_h200.jsonl")
    ap.add_argument("--list", action="store_true", help="print the shapes and exit (CPU)")


def run(a: argparse.Namespace) -> int:
    lengths = seqlens()
    shape = {"sequences": len(lengths), "patches": sum(lengths), "max_seqlen": max(lengths), "heads": HEADS,
             "head_dim": HEAD_DIM, "gflop_fwd_bwd": round(flops(lengths) / 1e9, 1)}
    if a.list:
        print(shape, lengths)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("vit_attention: needs a GPU (--list prints the shapes here)", file=sys.stderr)
        return 2
    only = f" --only {' '.join(a.only)}" if a.only != list(VARIANTS) else ""
    cmd = experiments.command(__name__) + only
    for name, metrics in measure(a.only, a.repeats, a.iters, lengths):
        if "skipped" in metrics:  # nothing measured: said here, no row
            print(f"[vit_attention] {name} skipped: {metrics['skipped']}", flush=True)
            continue
        store.append(a.results, f"vit-attention_{name}", cmd, metrics, shape=shape, seqlens=lengths,
                       device=torch.cuda.get_device_name(0), torch=torch.__version__)
        print(f"[vit_attention] {name}: {metrics}", flush=True)
    return 0
