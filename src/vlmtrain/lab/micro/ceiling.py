"""The matmul ceiling: the bf16 GEMM rate this card reaches with torch.matmul, at 8192^3 and at the GEMM shapes
of benchmark H1's model, one row each in results/perf_h200.jsonl; and, once an H1 summary of the same machine run
exists, each tower's achieved rate against its own GEMMs' measured rate (`towers_vs_ceiling`).

Shapes come from the model config (conf/model/qwen3_vl_30b_a3b.yaml through vlmtrain.config) and the token counts from
the H1 case (conf/tune/perf_h200.yaml `h1`): M = one micro-batch's tokens, the packing capacity T, for the decoder's
attention projections; T x topk / experts tokens per expert for the expert GEMMs (one expert alone, and all experts
as one batched matmul, what a grouped GEMM does at best); 4T patches (2x2 merge: a row of only image tokens, the
upper bound) for the ViT's linear layers and T for the projector's (merger and deepstack mergers). Each shape is timed
over `iters` back-to-back matmuls between CUDA events, `repeats` times after warm-up; the row is the median with the
min-max spread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vlmtrain.config import architecture as arch
from vlmtrain.lab import vs_bridge
from vlmtrain.lab.kit import baselines, experiments, schedule, store

if TYPE_CHECKING:
    from vlmtrain.config.groups.model import ModelConfig

PREFIX = "matmul-ceiling_"
H1_MODEL = [*baselines.L4_30B, "experiment=perf_h200x2_best", "gpus_per_node=1", "parallelism.ep=1"]
"""The H1 case's model and packing capacity, composed as conf/tune/perf_h200.yaml's `h1` case composes them."""


@dataclass(frozen=True)
class Gemm:
    name: str
    tower: str | None
    """vit | projector | decoder; None for the square reference."""
    m: int
    k: int
    n: int
    batch: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.k * self.n


def shapes(m: ModelConfig, tokens: int) -> list[Gemm]:
    """The reference and the model's forward GEMMs at `tokens` tokens per micro-batch."""
    h, v = m.hidden_size, m.vit
    q, kv = arch.attention_widths(m)
    per_expert = max(1, tokens * m.moe_topk // m.num_experts)
    patches, merged = arch.PATCHES_PER_TOKEN * tokens, arch.PATCHES_PER_TOKEN * v.hidden_size
    f = m.moe_ffn_hidden_size
    return [
        Gemm("square_8192", None, 8192, 8192, 8192),
        Gemm("vit_qkv", "vit", patches, v.hidden_size, 3 * v.hidden_size),
        Gemm("vit_proj", "vit", patches, v.hidden_size, v.hidden_size),
        Gemm("vit_fc1", "vit", patches, v.hidden_size, v.intermediate_size),
        Gemm("vit_fc2", "vit", patches, v.intermediate_size, v.hidden_size),
        Gemm("merger_fc1", "projector", tokens, merged, merged),
        Gemm("merger_fc2", "projector", tokens, merged, h),
        Gemm("decoder_qkv", "decoder", tokens, h, q + 2 * kv),
        Gemm("decoder_out", "decoder", tokens, q, h),
        Gemm("expert_fc1", "decoder", per_expert, h, 2 * f),  # gated: gate and up in one GEMM
        Gemm("expert_fc2", "decoder", per_expert, f, h),
        Gemm("experts_fc1_batched", "decoder", per_expert, h, 2 * f, m.num_experts),
        Gemm("experts_fc2_batched", "decoder", per_expert, f, h, m.num_experts),
    ]


def h1_shapes() -> tuple[list[Gemm], dict[str, Any]]:
    """The shapes of the H1 case, and what they were read from."""
    from vlmtrain.config.compose import compose
    from vlmtrain.config.groups.data import row_length

    run = compose(H1_MODEL)
    tokens = row_length(run)
    return shapes(run.model, tokens), {"model": run.model.name, "tokens_per_micro_batch": tokens,
                                       "peak_bf16_tflops": run.hardware.peak_bf16_tflops}


def time_gemm(g: Gemm, repeats_n: int, iters: int) -> list[float]:
    """TFLOP/s of each timed repeat (CUDA events around `iters` matmuls, after 3 warm-up ones)."""
    import torch

    shape_a = (g.batch, g.m, g.k) if g.batch > 1 else (g.m, g.k)
    shape_b = (g.batch, g.k, g.n) if g.batch > 1 else (g.k, g.n)
    a = torch.randn(shape_a, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(shape_b, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b)
    rates = []
    for _ in range(repeats_n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            torch.matmul(a, b)
        end.record()
        end.synchronize()
        rates.append(g.flops * iters / (start.elapsed_time(end) / 1e3) / 1e12)
    return rates


def iterations(g: Gemm, target_s: float = 0.05, guess_tflops: float = 500.0) -> int:
    """Matmuls per timed repeat: about `target_s` at a guessed rate, at least 10 (launch overhead amortized)."""
    return max(10, int(target_s * guess_tflops * 1e12 / g.flops))


def row_metrics(g: Gemm, rates: list[float], peak: float) -> dict[str, Any]:
    med = statistics.median(rates)
    return {**schedule.spread(rates, "tflops_per_s"), "fraction_of_peak": med / peak, "repeats": len(rates),
            "m": g.m, "k": g.k, "n": g.n, "batch": g.batch, "tower": g.tower}


def tower_ceilings(rows: list[dict[str, Any]], machine_run: str) -> dict[str, float]:
    """Per tower, the measured rate of its GEMMs on `machine_run` (FLOP-weighted: their FLOPs over their summed times,
    one matmul of each; the expert GEMMs by their batched form, how the grouped GEMM runs them)."""
    mine = {r["name"].removeprefix(PREFIX).removesuffix(f"_{machine_run}"): r["metrics"] for r in rows
            if r["name"].startswith(PREFIX) and r.get("machine_run") == machine_run and "tflops_per_s" in r["metrics"]}
    out = {}
    for tower in ("vit", "projector", "decoder"):
        parts = [m for n, m in mine.items() if m.get("tower") == tower and not n.startswith("expert_")]
        if parts:
            fl = [2.0 * m["batch"] * m["m"] * m["k"] * m["n"] for m in parts]
            out[tower] = sum(fl) / sum(f / m["tflops_per_s"] for f, m in zip(fl, parts, strict=True))
    return out


def towers_vs_ceiling(rows: list[dict[str, Any]], machine_run: str, peak: float) -> dict[str, Any] | None:
    """The best full-training H1 case of the machine run (vs_bridge.best_h1): each tower's achieved TFLOP/s
    (mfu_<tower> x peak) and its fraction of that tower's measured GEMM rate;
    None until both exist on the machine run."""
    ceilings, h1 = tower_ceilings(rows, machine_run), vs_bridge.best_h1(rows, machine_run)
    if not ceilings or h1 is None:
        return None
    best, m = h1[0], h1[1]["metrics"]
    out: dict[str, Any] = {"case": best, "square_8192_tflops_per_s": next(
        (r["metrics"]["tflops_per_s"] for r in rows if r["name"] == f"{PREFIX}square_8192_{machine_run}"), None)}
    for tower, ceiling in ceilings.items():
        if f"mfu_{tower}" in m:
            achieved = m[f"mfu_{tower}"] * peak
            out |= {f"{tower}_tflops_per_s": achieved, f"{tower}_gemm_ceiling_tflops_per_s": ceiling,
                    f"{tower}_fraction_of_gemm_ceiling": achieved / ceiling}
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--repeats", type=experiments.at_least(3, "a median needs them"), default=5,
                    help="timed repeats per shape (median and min-max)")
    experiments.add_results(ap, "perf_h200.jsonl")
    experiments.add_machine_run(ap)
    ap.add_argument("--list", action="store_true", help="print the shapes and exit (CPU)")
    ap.add_argument("--towers", metavar="MACHINE_RUN", help="CPU: append MACHINE_RUN's towers-vs-ceiling row again "
                    "from the recorded rows (after the benchmark's summary landed on that machine run later than its "
                    "ceiling rows)")


def run(args: argparse.Namespace) -> int:
    import json

    gemms, source = h1_shapes()
    if args.towers:
        cmd = f"{experiments.command(__name__)} --towers {args.towers}"
        return 0 if append_towers(args.results, args.towers, source["peak_bf16_tflops"], cmd) else 1
    if args.list:
        for g in gemms:
            print(f"{g.name:<22} {g.tower or '-':<9} batch {g.batch:>3}  M {g.m:>6}  K {g.k:>5}  N {g.n:>5}  "
                  f"{g.flops / 1e9:9.1f} GFLOP  {iterations(g)} per repeat")
        print(json.dumps(source))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("matmul_ceiling: needs a GPU (--list prints the shapes here)", file=sys.stderr)
        return 2
    machine_run = store.machine_run(args.machine_run, store.machine_runs(args.results))
    peak = source["peak_bf16_tflops"]
    cmd = experiments.command(__name__) + (f" --repeats {args.repeats}" if args.repeats != 5 else "")
    for g in gemms:
        metrics = row_metrics(g, time_gemm(g, args.repeats, iterations(g)), peak)
        store.append(args.results, f"{PREFIX}{g.name}_{machine_run}", cmd, metrics, machine_run=machine_run,
                       source=source, device=torch.cuda.get_device_name(0))
        print(f"[ceiling] {g.name}: {metrics['tflops_per_s']:.0f} TFLOP/s ({metrics['tflops_per_s_min']:.0f}-"
              f"{metrics['tflops_per_s_max']:.0f}), {metrics['fraction_of_peak']:.1%} of {peak:.0f}", flush=True)
    append_towers(args.results, machine_run, peak, cmd)
    return 0


def append_towers(path: Any, machine_run: str, peak: float, command: str) -> dict[str, Any] | None:
    """The towers-vs-ceiling row of `machine_run`, once its ceiling rows and an H1 summary are in the results file."""
    metrics = towers_vs_ceiling(store.read(path), machine_run, peak)
    if metrics is None:
        print(f"[ceiling] no summary of a full-training {vs_bridge.H1_PREFIX}* case on {machine_run} yet: the "
              "towers-vs-ceiling row comes with a later run", flush=True)
        return None
    print(f"[ceiling] towers vs their GEMM ceilings ({machine_run}): {metrics}", flush=True)
    return store.append(path, f"towers-vs-ceiling_{machine_run}", command, metrics, machine_run=machine_run)
