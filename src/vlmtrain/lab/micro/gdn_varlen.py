"""Megatron's Gated DeltaNet kernels on one packed row against each segment alone, forward and every gradient, at a
model's own shapes: which of them a packed (THD) row changes. Packing Qwen3.5 at H2's shapes agreed in the forward
but not in the gradient (docs/measurements.md, packing equivalence), and packed training there did not learn; the
packed path differs from the unpacked one in the GDN only where Megatron hands the row's `cu_seqlens` to FLA's
`causal_conv1d` and `chunk_gated_delta_rule`.

    vlmtrain lab gdn-varlen [--model qwen35_vl_35b_a3b] [--lengths 1210 377 2417 96] [--list]

Three checks, each the same random inputs packed (one [1, T, ...] row, `cu_seqlens`) and alone (each segment its
own call, no `cu_seqlens`; weight gradients summed over the segments), in BF16 as training runs them:
- conv: `causal_conv1d` (SiLU, no bias: Qwen3.5's conv) on the q, k, v channels;
- rule: `chunk_gated_delta_rule` on L2-normed q, k (value heads' share repeated, as Megatron does), v, the decay g
  and beta, with no state carried in;
- layer: the two in Megatron's order (GatedDeltaNet.forward between in_proj and the output norm): conv, split,
  L2 norm, repeat, g = -exp(A_log) softplus(alpha + dt_bias), beta = sigmoid(b), the rule.
Each tensor's packed-vs-alone relative error (||packed - alone|| / ||alone||) and cosine are printed beside its
rounding floor: the same alone computation from the FP32 inputs rounded once more (BF16 against FP32 of one kernel).
A tensor fails where its error is above FLOOR_MARGIN x its floor and above ABS_TOL: the kernel computes another
function on a packed row. One row per check in results/gdn_varlen.jsonl.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from typing import Any

from vlmtrain.lab.kit import experiments, store

FLOOR_MARGIN = 4.0
"""How far past its own BF16 rounding a packed tensor may be (the packing harness allows 3x on the model's CE)."""
ABS_TOL = 2e-3
"""A relative error this small passes whatever the floor (a floor of 0 where both paths run the same kernel)."""
LENGTHS = (1210, 377, 2417, 96)
"""Segments of one packed row: three samples of data=realistic's range and one shorter than a 64-token chunk."""


def shapes(model: str) -> dict[str, int]:
    """The GDN's heads, head dims and conv width of a model option (conf/model/<model>.yaml)."""
    from vlmtrain.config import architecture as arch
    from vlmtrain.config.compose import compose

    la = compose([f"model={model}"]).model.linear_attention
    return {"key_heads": la.num_key_heads, "value_heads": la.num_value_heads, "key_head_dim": la.key_head_dim,
            "value_head_dim": la.value_head_dim, "conv_width": arch.GDN_CONV_KERNEL}


def leaves(s: dict[str, int], total: int, seed: int = 0, device: str = "cuda") -> dict[str, Any]:
    """FP32 random inputs of the layer check (the conv and rule checks take their parts)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    hk, hv, dk, dv = s["key_heads"], s["value_heads"], s["key_head_dim"], s["value_head_dim"]
    channels = 2 * hk * dk + hv * dv

    def rand(*shape: int, scale: float = 1.0) -> Any:
        return torch.randn(*shape, device=device, generator=g) * scale

    return {"x": rand(1, total, channels), "conv_weight": rand(channels, s["conv_width"], scale=0.5),
            "alpha": rand(1, total, hv), "b": rand(1, total, hv),
            "A_log": torch.log(torch.empty(hv, device=device).uniform_(1, 16, generator=g)),
            "dt_bias": torch.ones(hv, device=device),
            "q": rand(1, total, hv, dk), "k": rand(1, total, hv, dk), "v": rand(1, total, hv, dv),
            "g": -rand(1, total, hv).abs() * 0.1, "beta": rand(1, total, hv).sigmoid(),
            "grad_conv": rand(1, total, channels), "grad_out": rand(1, total, hv, dv)}


def _conv1d(t: dict[str, Any], cu: Any) -> Any:
    """The q, k, v channels through FLA's causal conv as GatedDeltaNet.forward calls it."""
    from megatron.core.ssm.gated_delta_net.common import causal_conv1d

    y, _ = causal_conv1d(x=t["x"], weight=t["conv_weight"], bias=None, activation="silu", initial_state=None,
                         output_final_state=False, cu_seqlens=cu)
    return y


def conv(t: dict[str, Any], s: dict[str, int], cu: Any) -> tuple[Any, dict[str, Any]]:
    y = _conv1d(t, cu)
    return (y * t["grad_conv"]).sum(), {"y": y}


def rule(t: dict[str, Any], s: dict[str, int], cu: Any) -> tuple[Any, dict[str, Any]]:
    from megatron.core.ssm.gated_delta_net.common import chunk_gated_delta_rule, l2norm

    o, _ = chunk_gated_delta_rule(l2norm(t["q"]), l2norm(t["k"]), t["v"], g=t["g"].float(), beta=t["beta"],
                                  initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                                  cu_seqlens=cu)
    return (o * t["grad_out"]).sum(), {"o": o}


def layer(t: dict[str, Any], s: dict[str, int], cu: Any) -> tuple[Any, dict[str, Any]]:
    """GatedDeltaNet.forward's middle, as Megatron Core 0.19 writes it (gdn.py, common.py)."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from megatron.core.ssm.gated_delta_net.common import chunk_gated_delta_rule, l2norm

    hk, hv, dk, dv = s["key_heads"], s["value_heads"], s["key_head_dim"], s["value_head_dim"]
    qkv = _conv1d(t, cu)
    n = qkv.shape[1]
    qk, v = torch.split(qkv, [2 * hk * dk, hv * dv], dim=-1)
    qk = l2norm(qk.reshape(1, n, -1, dk).contiguous())
    q, k = torch.split(qk, [hk, hk], dim=2)
    q, k = (x.repeat_interleave(hv // hk, dim=2).contiguous() for x in (q, k))
    v = v.reshape(1, n, -1, dv).contiguous()
    g = -t["A_log"].float().exp() * F.softplus(t["alpha"].float() + t["dt_bias"].float())
    o, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=t["b"].sigmoid(), initial_state=None, output_final_state=False,
                                  use_qk_l2norm_in_kernel=False, cu_seqlens=cu)
    return (o * t["grad_out"]).sum(), {"o": o}


CHECKS: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "conv": (conv, ("x", "conv_weight")),
    "rule": (rule, ("q", "k", "v", "g", "beta")),
    "layer": (layer, ("x", "conv_weight", "alpha", "b", "A_log", "dt_bias")),
}
"""check -> (its function, the leaves it differentiates)."""
PER_TOKEN = {"x", "alpha", "b", "q", "k", "v", "g", "beta", "grad_conv", "grad_out"}
"""Inputs with a token dimension (sliced per segment); the rest are weights, shared and their gradients summed."""


def run_check(fn: Callable[..., Any], grads: tuple[str, ...], inputs: dict[str, Any], s: dict[str, int],
              lengths: list[int], dtype: Any, packed: bool) -> dict[str, Any]:
    """fn's outputs and the gradients of `grads`, packed in one call or each segment alone, from `inputs` cast to
    dtype."""
    import torch

    if packed:
        t = {k: v.detach().to(dtype).requires_grad_(k in grads) for k, v in inputs.items()}
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=inputs["x"].device)
        loss, out = fn(t, s, cu)
        loss.backward()
        return {**{k: v.detach().float() for k, v in out.items()}, **{f"d_{k}": t[k].grad.float() for k in grads}}
    parts: list[dict[str, Any]] = []
    weights = {k: v.detach().to(dtype).requires_grad_(k in grads) for k, v in inputs.items()
               if k not in PER_TOKEN}
    for start, end in itertools.pairwise([0, *itertools.accumulate(lengths)]):
        t = {**weights, **{k: v[:, start:end].detach().to(dtype).requires_grad_(k in grads) for k, v in inputs.items()
                           if k in PER_TOKEN}}
        loss, out = fn(t, s, None)
        loss.backward()
        parts.append({**{k: v.detach().float() for k, v in out.items()},
                      **{f"d_{k}": t[k].grad.float() for k in grads if k in PER_TOKEN}})
    merged = {k: torch.cat([p[k] for p in parts], dim=1) for k in parts[0]}
    return {**merged, **{f"d_{k}": weights[k].grad.float() for k in grads if k not in PER_TOKEN}}


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per tensor: relative error of a against b, and their cosine."""
    import torch

    out = {}
    for k in b:
        x, y = a[k].flatten(), b[k].flatten()
        out[k] = {"rel_err": float((x - y).norm() / y.norm().clamp_min(1e-30)),
                  "cosine": float(torch.nn.functional.cosine_similarity(x, y, dim=0))}
    return out


def verdict(packed: dict[str, dict[str, float]], floor: dict[str, dict[str, float]]) -> list[str]:
    """The tensors a packed row changes: past FLOOR_MARGIN x their rounding floor and past ABS_TOL."""
    return [k for k, m in packed.items()
            if m["rel_err"] > max(ABS_TOL, FLOOR_MARGIN * floor[k]["rel_err"])]


def measure(fn: Callable[..., Any], grads: tuple[str, ...], s: dict[str, int], lengths: list[int],
            device: str = "cuda") -> dict[str, Any]:
    """fn packed against alone, and alone in BF16 against FP32 (the floor), with the tensors packing changed."""
    import torch

    inputs = leaves(s, sum(lengths), device=device)
    alone = run_check(fn, grads, inputs, s, lengths, torch.bfloat16, packed=False)
    packed = run_check(fn, grads, inputs, s, lengths, torch.bfloat16, packed=True)
    vs_alone, out = compare(packed, alone), {}
    try:
        floor = compare(alone, run_check(fn, grads, inputs, s, lengths, torch.float32, packed=False))
    except Exception as e:  # a kernel without an FP32 path: judged by ABS_TOL alone, and said so
        floor, out["floor_unavailable"] = None, f"{type(e).__name__}: {e}"
    judged = floor or {k: {"rel_err": 0.0} for k in vs_alone}
    return {"packed_vs_alone": vs_alone, "rounding_floor": floor, **out, "changed": verdict(vs_alone, judged)}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="qwen35_vl_35b_a3b", help="a model option with Gated DeltaNet layers")
    ap.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="the packed row's segments")
    ap.add_argument("--only", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    experiments.add_results(ap, "gdn_varlen.jsonl")
    ap.add_argument("--list", action="store_true", help="print the shapes and exit (CPU)")


def run(a: argparse.Namespace) -> int:
    s = shapes(a.model)
    if a.list:
        print({"model": a.model, **s, "lengths": a.lengths})
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gdn_varlen: needs a GPU (--list prints the shapes here)", file=sys.stderr)
        return 2
    cmd = f"{experiments.command(__name__)} --model {a.model} --lengths {' '.join(map(str, a.lengths))}"
    failed = 0
    for name in a.only:
        m = measure(*CHECKS[name], s, a.lengths)
        failed += bool(m["changed"])
        store.append(a.results, f"gdn-varlen_{a.model}_{name}", cmd, {**m, "passed": not m["changed"]},
                     shapes=s, lengths=a.lengths, device=torch.cuda.get_device_name(0))
        floor = m["rounding_floor"] or {}
        worst = {k: f"{v['rel_err']:.2e} (floor {floor.get(k, {}).get('rel_err', float('nan')):.2e}, "
                    f"cos {v['cosine']:.5f})" for k, v in m["packed_vs_alone"].items()}
        print(f"[gdn_varlen] {name}: {'changed ' + ', '.join(m['changed']) if m['changed'] else 'same'}; {worst}",
              flush=True)
    return 1 if failed else 0
