"""Issue 9: fastest real-image MoE-VLM training on 2 x H200. Runs named cases and appends one row per case to
results/perf_h200x2.jsonl (metrics from vlmtrain.observe.results.summarize, the full override list as `config`).

    python benchmarks/perf_h200x2.py --sweep mbs parallelism [--only SUBSTR ...] [--iterations 8]
    python benchmarks/perf_h200x2.py --sweep all --dry-run     # CPU: preflight + Bridge validation of every case
    python benchmarks/perf_h200x2.py --sweep all --list        # the case table only
    python benchmarks/perf_h200x2.py --report                  # results/perf_h200x2.md from the results file

The benchmark: Qwen3-VL-30B-A3B layer shapes, 8 decoder layers, full ViT, trainable vision and decoder, real
images (data=realistic at conf/data/realistic.yaml's distribution), seq 4096, BF16, one 2-GPU node. Every case
differs from BASE only in the knobs its name spells out; GBS is 16 unless the name says `_gbs<N>`, so cases
without that do equal useful work (same samples per step) and MBS changes only the gradient accumulation. Cases
run one at a time (each uses both GPUs) through benchmarks/run_cases.py's machinery.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmtrain.observe.bench import cases as run_cases
from vlmtrain.observe.bench.cases import ROOT, Case

GPUS = 2
GBS = 16  # a multiple of MBS 8 x DP 2: grad-accum 8/4/2/1 over the MBS sweep, 16 with TP2 (DP 1)
ITERATIONS = 8  # summarize() skips 3 warm-up steps: 5 measured
CASE_S = 120  # device seconds per case: 82-154 s measured (wall_s in results/perf_h200x2.jsonl)
BASE = [
    "model=qwen3_vl_30b_a3b",
    "model.num_layers=8",
    "hardware=h200",
    "train.seq_length=4096",
]  # then train.global_batch_size (Knobs.gbs)
PARALLELISM = {
    "fsdp-ep2": ["parallelism=fsdp", "parallelism.ep=2"],
    "3d-ep2": ["parallelism=3d", "parallelism.ep=2"],
    "3d-tp2-ep2": ["parallelism=3d", "parallelism.tp=2", "parallelism.ep=2"],
    # EP 1: the one 2-GPU layout where Bridge's Qwen-VL step does not pad every sample to seq_length
    "fsdp-ep1": ["parallelism=fsdp", "parallelism.ep=1"],
}
# Kernel choices (Hopper's CUTLASS grouped GEMM for the experts; TE's fused router and cross entropy) as the raw
# overrides the kernels sweep ran with, before the kernels group existed (kernels=fast is both; the rows keep what ran).
KERNELS = {
    "cutlass": ["+hardware.env.NVTE_USE_CUTLASS_GROUPED_GEMM=1"],
    "fused": ["+bridge.model.moe_router_fusion=true", "+bridge.model.cross_entropy_fusion_impl=te"],
    # what benchmarks/profile_step.py found in the best case (vlmtrain.train.bridge_patches; kernels=fast has all three)
    "rope": ["kernels.rope=te"],
    "vitpos": ["kernels.vit_positions=vectorized"],
    "pin": ["kernels.pin_visual_inputs=true"],
}
FAST = ("cutlass", "fused")  # kernels=fast before the fast paths (FASTPATHS below is today's kernels=fast)
RESULTS = ROOT / "results" / "perf_h200x2.jsonl"
PACKED_TOKENS_PER_SAMPLE = 1024
"""A packed knob of MBS m runs as data.packing=m x this, at least train.seq_length (issue 22: packing by token
budget; this payload's samples average ~865 tokens, and greedy bins of 12288 fill 93.7 %, ~12.8 samples a row),
MBS 1 and GBS gbs/m rows. Rows recorded before that change packed m samples per micro-batch; each row's `command`
says which form ran."""


@dataclass(frozen=True)
class Knobs:
    """One point of the search space; BASE plus these overrides is the whole configuration."""

    parallelism: str = "fsdp-ep2"
    mbs: int = 1
    recompute: str = "none"
    graph: str = "none"
    dispatcher: str = "alltoall"
    vision: str = "trainable"
    data: str = "realistic"
    packing: bool = False
    gbs: int = GBS
    kernels: tuple[str, ...] = ()
    """KERNELS entries: kernel choices beyond the config groups', tried before a group owns them."""

    def name(self) -> str:
        packed = "_packed" if self.packing else ""
        gbs = f"_gbs{self.gbs}" if self.gbs != GBS else ""
        return (f"30b-l8_{self.parallelism}_mbs{self.mbs}_{self.vision}_rc-{self.recompute}_cg-{self.graph}"
                f"_{self.dispatcher}_{self.data}{packed}{gbs}{''.join('_' + k for k in self.kernels)}")

    def overrides(self, iterations: int = ITERATIONS) -> list[str]:
        rows, mbs = (self.gbs // self.mbs, 1) if self.packing else (self.gbs, self.mbs)
        out = [*BASE, f"train.global_batch_size={rows}", f"data={self.data}", *PARALLELISM[self.parallelism],
               f"train.iterations={iterations}",
               f"train.micro_batch_size={mbs}", f"recompute={self.recompute}", f"cuda_graph={self.graph}",
               f"dispatcher={self.dispatcher}", f"vision={self.vision}"]
        out += [o for k in self.kernels for o in KERNELS[k]]
        if self.packing:
            out.append(f"data.packing={max(self.mbs * PACKED_TOKENS_PER_SAMPLE, 4096)}")  # BASE's seq_length
        return out


B = Knobs()
SWEEPS: dict[str, list[Knobs]] = {
    # Unpacked, trainable vision fits MBS 1 and 2 without recompute (77-103 GiB by vlmtrain.check.memory); MBS 4 needs
    # full recompute, which preflight refuses with trainable deepstack mergers (deepstack_full_recompute).
    "mbs": [dataclasses.replace(B, parallelism=p, mbs=m) for p in ("fsdp-ep2", "3d-ep2") for m in (1, 2)],
    "recompute_graph": [dataclasses.replace(B, parallelism="3d-ep2", recompute=r, graph=g)
                        for r in ("none", "selective") for g in ("none", "moe_router_preprocess")],
    "dispatcher": [dataclasses.replace(B, dispatcher=d) for d in ("alltoall", "deepep", "hybridep")],
    "parallelism": [dataclasses.replace(B, parallelism=p) for p in PARALLELISM],
    "packing": [dataclasses.replace(B, parallelism=p, mbs=2, packing=k) for p in ("fsdp-ep2", "3d-ep2")
                for k in (False, True)],
    # Packed micro-batches hold only real tokens (~1/5 of MBS x seq_length here), so MBS can grow to GBS / DP
    "packed_mbs": [dataclasses.replace(B, parallelism=p, mbs=m, packing=True) for p in ("3d-ep2", "fsdp-ep2")
                   for m in (2, 4, 8)] + [dataclasses.replace(B, parallelism="fsdp-ep1", mbs=4, packing=True)],
    "frozen": [dataclasses.replace(B, parallelism=p, mbs=m, vision=v, packing=k)
               for p, m, k in (("fsdp-ep2", 1, False), ("3d-ep2", 2, False), ("3d-ep2", 4, True))
               for v in ("trainable", "frozen")],
    "mock": [B, dataclasses.replace(B, data="mock")],
}
PACKED = dataclasses.replace(B, parallelism="3d-ep2", mbs=8, packing=True)  # fastest of the groups' own knobs
# Packed steps cost about the same whatever their tokens (the decoder's per-micro-batch time hardly moves from
# MBS 4 to 8): kernels that launch less, and more tokens per micro-batch / per optimizer step. PACKED first, so
# the sweep's own machine lease measures the reference too.
SWEEPS["kernels"] = [PACKED, dataclasses.replace(PACKED, kernels=("cutlass",)),
                     *(dataclasses.replace(PACKED, mbs=m, gbs=g, kernels=FAST)
                       for m, g in ((8, GBS), (12, 24), (8, 32), (16, 32), (8, 64), (12, 48), (12, 96)))]
KERNELS_BEST = dataclasses.replace(PACKED, mbs=12, gbs=96, kernels=FAST)  # the kernels sweep's fastest
# The profile of that case (results/profile_h200x2.jsonl): the GPU idled a third of the step; unfused RoPE, pageable
# pixel copies and per-image ViT position loops among the largest costs (vlmtrain.train.bridge_patches). The sweep runs
# its reference in the same lease; run it twice (`--sweep fastpaths` again) to see the spread.
FASTPATHS = (*FAST, "rope", "vitpos", "pin")  # = kernels=fast since the fast paths exist
SWEEPS["fastpaths"] = [KERNELS_BEST, dataclasses.replace(KERNELS_BEST, kernels=(*FAST, "rope")),
                       dataclasses.replace(KERNELS_BEST, kernels=FASTPATHS)]
# The fastest case measured (results/perf_h200x2.jsonl), shipped as conf/experiment/perf_h200x2_best.yaml; among
# cases within TIE of the fastest, the one with the smaller GBS.
BEST = dataclasses.replace(KERNELS_BEST, kernels=FASTPATHS)
TIE = 0.01  # far inside the ~4 % spread between two runs of one case on one lease (overhead.py's pair ratios)


def expand(sweeps: list[str], only: list[str] | None = None, iterations: int = ITERATIONS) -> list[tuple[Case, Knobs]]:
    """The cases of the named sweeps ("all" = every sweep), in order, each once (sweeps share their baseline)."""
    names = list(SWEEPS) if "all" in sweeps else sweeps
    seen: dict[str, tuple[Case, Knobs]] = {}
    for sweep in names:
        for k in SWEEPS[sweep]:
            if k.name() not in seen and (not only or any(s in k.name() for s in only)):
                seen[k.name()] = (Case(k.name(), GPUS, k.overrides(iterations)), k)
    return list(seen.values())


def table(cases: list[tuple[Case, Knobs]], status: dict[str, str] | None = None) -> str:
    """One line per case: what changes, the layout and the batch arithmetic (grad-accum = GBS / (MBS x DP))."""
    from vlmtrain.config import world
    from vlmtrain.config.compose import compose

    w = max(len(c.name) for c, _ in cases)
    lines = [f"{'case':<{w}}  {'layout':<12} {'MBS':>3} {'accum':>5}  status"]
    for case, k in cases:
        lay = world.layout(compose(run_cases.overrides(case, dry_run=True)))
        layout = f"TP{lay.tp} EP{lay.ep} DP{lay.dp}"
        accum = k.gbs // (k.mbs * lay.dp)
        lines.append(f"{case.name:<{w}}  {layout:<12} {k.mbs:>3} {accum:>5}  {(status or {}).get(case.name, '')}")
    return "\n".join(lines)


def dry_run(cases: list[tuple[Case, Knobs]], out: Path) -> dict[str, str]:
    """What `python train.py <case> dry_run=true` does (vlmtrain.flow.main -> plan.dry_run: preflight, build,
    Bridge's runtime_config_update for 2 x H200), in this one process so Bridge is imported once."""
    from vlmtrain.build import plan
    from vlmtrain.config.compose import compose

    status = {}
    for case, _ in cases:
        print(f"\n=== {case.name}: python train.py {' '.join(run_cases.overrides(case, dry_run=True))}", flush=True)
        rc = plan.dry_run(compose(run_cases.overrides(case, dry_run=True), output_dir=str(out / case.name)))
        status[case.name] = {0: "ok", 2: "PREFLIGHT ERROR", 3: "BRIDGE VALIDATION ERROR"}.get(rc, f"rc={rc}")
    return status


def latest_rows(results_path: Path) -> dict[str, dict[str, Any]]:
    """The results file's rows by case name (vlmtrain.observe.results.latest)."""
    from vlmtrain.observe import results

    return {r["name"]: r for r in results.latest(results.read_jsonl(results_path))}


def mock_ratio_row(ran: set[str], results_path: Path) -> dict[str, Any] | None:
    """Real vs mock at the same settings (how much faster Bridge's noise images look than real photos), once either
    side ran now; the other side may come from an earlier session's row in the same results file."""
    from vlmtrain.observe import results

    names = (B.name(), dataclasses.replace(B, data="mock").name())
    latest = latest_rows(results_path)
    real, mock = (latest.get(n) for n in names)
    if not (real and mock and ran & set(names)):
        return None
    r, m = real["metrics"], mock["metrics"]
    metrics = {"real_over_mock_useful_tokens_per_s_per_gpu": r["useful_tokens_per_s_per_gpu"]
               / m["useful_tokens_per_s_per_gpu"], "real_over_mock_step_s": r["step_s"] / m["step_s"]}
    print(f"[perf] real/mock: {metrics}", flush=True)
    return results.append(results_path, f"real-vs-mock_{B.name()}", "python benchmarks/perf_h200x2.py --sweep mock",
                   metrics, config={"real": real["config"], "mock": mock["config"]})


def _k(base: Knobs = B, **changes: Any) -> str:
    return dataclasses.replace(base, **changes).name()


# The seed's claims at this scale: (what, case A, case B); each ratio is A / B of the same metric, equal useful work.
CLAIMS = [
    ("frozen vision gain, FSDP EP2 MBS 1", _k(vision="frozen"), _k()),
    ("frozen vision gain, 3D EP2 MBS 2", _k(parallelism="3d-ep2", mbs=2, vision="frozen"),
     _k(parallelism="3d-ep2", mbs=2)),
    ("frozen vision gain, 3D EP2 MBS 4 packed", _k(parallelism="3d-ep2", mbs=4, packing=True, vision="frozen"),
     _k(parallelism="3d-ep2", mbs=4, packing=True)),
    ("MBS 2 vs 1, FSDP EP2", _k(mbs=2), _k()),
    ("MBS 2 vs 1, 3D EP2", _k(parallelism="3d-ep2", mbs=2), _k(parallelism="3d-ep2")),
    ("3D vs FSDP, EP2 MBS 1", _k(parallelism="3d-ep2"), _k()),
    ("3D vs FSDP, EP2 MBS 2", _k(parallelism="3d-ep2", mbs=2), _k(mbs=2)),
    ("3D vs FSDP, EP2 packed MBS 8", _k(parallelism="3d-ep2", mbs=8, packing=True), _k(mbs=8, packing=True)),
    ("packing vs not, FSDP EP2 MBS 2", _k(mbs=2, packing=True), _k(mbs=2)),
    ("packing vs not, 3D EP2 MBS 2", _k(parallelism="3d-ep2", mbs=2, packing=True), _k(parallelism="3d-ep2", mbs=2)),
    ("real vs mock images, FSDP EP2 MBS 1", _k(), _k(data="mock")),
    ("packed MBS 4 vs 2, 3D EP2", _k(parallelism="3d-ep2", mbs=4, packing=True),
     _k(parallelism="3d-ep2", mbs=2, packing=True)),
    ("packed MBS 8 vs 2, 3D EP2", _k(parallelism="3d-ep2", mbs=8, packing=True),
     _k(parallelism="3d-ep2", mbs=2, packing=True)),
    ("packed MBS 4 vs 2, FSDP EP2", _k(mbs=4, packing=True), _k(mbs=2, packing=True)),
    ("packed MBS 8 vs 2, FSDP EP2", _k(mbs=8, packing=True), _k(mbs=2, packing=True)),
    ("FSDP EP1 vs EP2, packed MBS 4", _k(parallelism="fsdp-ep1", mbs=4, packing=True), _k(mbs=4, packing=True)),
    # the kernels sweep, all on one machine lease: 3D EP2 packed
    ("CUTLASS grouped GEMM vs cuBLAS multi-stream, MBS 8", _k(PACKED, kernels=("cutlass",)), _k(PACKED)),
    ("TE fused router + cross entropy on top, MBS 8", _k(PACKED, kernels=FAST), _k(PACKED, kernels=("cutlass",))),
    ("GBS 32 vs 16, MBS 8 (grad-accum 2 vs 1)", _k(PACKED, gbs=32, kernels=FAST), _k(PACKED, kernels=FAST)),
    ("GBS 64 vs 32, MBS 8", _k(PACKED, gbs=64, kernels=FAST), _k(PACKED, gbs=32, kernels=FAST)),
    ("GBS 48 vs 24, MBS 12", _k(PACKED, mbs=12, gbs=48, kernels=FAST), _k(PACKED, mbs=12, gbs=24, kernels=FAST)),
    ("GBS 96 vs 48, MBS 12", _k(PACKED, mbs=12, gbs=96, kernels=FAST), _k(PACKED, mbs=12, gbs=48, kernels=FAST)),
    ("MBS 12 vs 8 at grad-accum 2 (GBS 48 vs 32)", _k(PACKED, mbs=12, gbs=48, kernels=FAST),
     _k(PACKED, gbs=32, kernels=FAST)),
    # the fast paths the profile pointed at, on one lease: MBS 12 GBS 96
    ("TE fused RoPE on top, MBS 12 GBS 96", _k(KERNELS_BEST, kernels=(*FAST, "rope")), KERNELS_BEST.name()),
    ("host-built ViT positions + pinned pixels on top of that", BEST.name(), _k(KERNELS_BEST, kernels=(*FAST, "rope"))),
    ("all three fast paths vs none, MBS 12 GBS 96", BEST.name(), KERNELS_BEST.name()),
]


def repeats(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The finished runs of `name` from the same sweep invocation and day as its latest row (a sweep run twice in
    one lease), in order; re-summaries and superseded rows are not runs."""
    mine = [r for r in rows if r["name"] == name and "useful_tokens_per_s_per_gpu" in r["metrics"]
            and not {"resummarized", "superseded"} & r.keys()]
    if not mine:
        return []
    last = mine[-1]
    return [r for r in mine if (r["date"], r.get("runner")) == (last["date"], last.get("runner"))]


def report(results_path: Path) -> str:
    """Markdown from the results file alone: every measured case, then each claim's ratios (rows that are missing
    or failed are named, not guessed)."""
    from vlmtrain.observe import results

    rows = results.read_jsonl(results_path)
    latest = latest_rows(results_path)
    ok = {n: r["metrics"] for n, r in latest.items() if "useful_tokens_per_s_per_gpu" in r["metrics"]}
    lines = [f"# {results_path.name}: generated by `python benchmarks/perf_h200x2.py --report`"]
    for title, frozen in (("Full training (vision trainable)", False),
                          ("Frozen vision (benchmark-only: compare with frozen rows only)", True)):
        lines += ["", f"## {title}", "",
                  "| case | step_s | useful tok/s/GPU | MFU | peak GiB | useful fraction | ViT / decoder s | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for n, m in sorted(ok.items(), key=lambda kv: -kv[1]["useful_tokens_per_s_per_gpu"]):
            if ("_frozen_" in n) != frozen:
                continue
            note = ("exit 1 after training (see row)" if latest[n].get("rc") else
                    "rates are medians of per-step rates (run files lost)" if "rates" in latest[n] else "")
            split = f"{m['time_vision_s']:.2f} / {m['time_decoder_s']:.2f}" if "time_vision_s" in m else "-"
            lines.append(f"| {n} | {m['step_s']:.2f} | {m['useful_tokens_per_s_per_gpu']:.0f} | {m['mfu']:.1%} | "
                         f"{m['peak_mem_gib']:.0f} | {m['nonpad_fraction']:.1%} | {split} | {note} |")
    # first_loss: step 1 sees the same samples from the same initialization in every case of one vision/data
    # setting, so A and B agreeing says both trained the same model on the same tokens
    lines += ["", "## The seed's claims at this scale", "",
              "| claim | useful tok/s/GPU A/B | step_s A/B | first_loss A, B | A/B per repeat |",
              "|---|---|---|---|---|"]
    for what, a, b in CLAIMS:
        if any("rates" in latest.get(n, {}) for n in (a, b)):
            what += " (one side's rates are medians of per-step rates)"
        if a in ok and b in ok:
            useful = ok[a]["useful_tokens_per_s_per_gpu"] / ok[b]["useful_tokens_per_s_per_gpu"]
            ra, rb = repeats(rows, a), repeats(rows, b)
            per = [x["metrics"]["useful_tokens_per_s_per_gpu"] / y["metrics"]["useful_tokens_per_s_per_gpu"]
                   for x, y in zip(ra, rb, strict=False)] if len(ra) == len(rb) > 1 else []
            lines.append(f"| {what} | {useful:.2f} | {ok[a]['step_s'] / ok[b]['step_s']:.2f} | "
                         f"{ok[a]['first_loss']:.4f}, {ok[b]['first_loss']:.4f} | "
                         f"{', '.join(f'{x:.2f}' for x in per)} |")
        else:
            lines.append(f"| {what} | not measured: {', '.join(n for n in (a, b) if n not in ok)} | | | |")
    failed = [n for n, r in latest.items() if n not in ok and r.get("rc")]
    lines += ["", *(f"- failed: {n}: {latest[n].get('error', '')}" for n in failed)]
    for n, r in latest.items():
        if n.startswith("overhead_"):
            over = r["metrics"]
            line = (f"- overhead_ratio (vlmtrain / Bridge pretrain() alone) of {n.removeprefix('overhead_')}: "
                    f"{over['overhead_ratio']:.3f} over {over['pairs']} pair(s) of {over['steady_steps_per_run']}+ "
                    f"steady steps (per pair: {', '.join(f'{x:.3f}' for x in over['pair_ratios'])})")
            if over.get("overhead_ratio_pairs_ci95"):
                lo, hi = over["overhead_ratio_pairs_ci95"]
                line += (f"; total steady step time per pair {', '.join(f'{x:.3f}' for x in over['pair_total_ratios'])}"
                         f", geometric mean {over['overhead_ratio_pairs']:.3f}, 95 % interval over pairs "
                         f"{lo:.3f}-{hi:.3f}")
            elif over.get("overhead_ratio_total") is not None:
                lo, hi = over["overhead_ratio_total_ci95"]
                line += (f"; total steady step time {over['overhead_ratio_total']:.3f} (bootstrap 95 % interval "
                         f"over steps {lo:.3f}-{hi:.3f})")
            if over.get("vlmtrain_host_ms") is not None:
                line += (f"; median of per-step ratios {over['overhead_ratio_paired']:.3f}; vlmtrain's own host code "
                         f"{over['vlmtrain_host_ms']:.1f} ms per step = {over['vlmtrain_host_fraction']:.2%} of it")
            for p in r.get("pairs_detail", []):
                if {"vlmtrain", "direct"} <= p.get("profile", {}).keys():
                    a, b = p["profile"]["vlmtrain"], p["profile"]["direct"]
                    line += (f"; traced step, vlmtrain / direct: window {a['window_ms']:.0f} / {b['window_ms']:.0f} "
                             f"ms, GPU busy {a['gpu_busy_ms']:.0f} / {b['gpu_busy_ms']:.0f} ms, of it NCCL "
                             f"{a['kernel_ms_by_family'].get('nccl', 0):.0f} / "
                             f"{b['kernel_ms_by_family'].get('nccl', 0):.0f} ms")
            if r.get("note"):
                line += f" ({r['note']})"
            lines.append(line)
        if n.startswith("lease-spread_"):
            m = r["metrics"]
            lines.append(f"- the same case on two machine leases, {n.removeprefix('lease-spread_')}: "
                         f"{m['useful_tokens_per_s_per_gpu_first_lease']:.0f} and "
                         f"{m['useful_tokens_per_s_per_gpu_second_lease']:.0f} useful tokens/s/GPU "
                         f"({m['second_over_first_useful_tokens_per_s_per_gpu']:.2f}x): cross-lease ratios carry it")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", nargs="+", choices=[*SWEEPS, "all"])
    ap.add_argument("--only", nargs="*", help="case names (substring match)")
    ap.add_argument("--iterations", type=int, default=ITERATIONS)
    ap.add_argument("--dry-run", action="store_true", help="dry_run=true for every case (CPU: no GPU needed)")
    ap.add_argument("--list", action="store_true", help="print the case table and exit")
    ap.add_argument("--report", action="store_true", help="write <results>.md (cases, claims) from --results and exit")
    ap.add_argument("--skip-done", action="store_true",
                    help="leave out cases whose latest row in --results finished (rc 0); failed ones run again")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no case that would end after this many seconds (estimate: the slowest case so far, "
                         f"{CASE_S} s before the first), so a time-limited device call loses no half-run case")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "perf_h200x2" / time.strftime("%Y%m%d-%H%M%S"))
    args = ap.parse_args(argv)
    if args.report:
        args.results.with_suffix(".md").write_text(report(args.results))
        print(args.results.with_suffix(".md").read_text())
        return 0
    if not args.sweep:
        ap.error("--sweep is required (or --report)")
    cases = expand(args.sweep, args.only, args.iterations)
    if args.skip_done:
        done = {n for n, r in latest_rows(args.results).items() if not r.get("rc")}
        cases = [(c, k) for c, k in cases if c.name not in done]
    if not cases:
        print("[perf] no case matches", file=sys.stderr)
        return 2
    print(f"[perf] {len(cases)} case(s), ~{len(cases) * CASE_S / 60:.0f} min of device time at ~{CASE_S} s each")
    if args.list:
        print(table(cases))
        return 0
    if args.dry_run:
        status = dry_run(cases, args.out)
        print("\n" + table(cases, status))
        return 0 if all(s == "ok" for s in status.values()) else 1
    from vlmtrain.config.world import local_gpus

    if local_gpus() < GPUS:
        print(f"[perf] needs {GPUS} GPUs, this machine has {local_gpus()}: use --dry-run here", file=sys.stderr)
        return 2
    failed, ran, t0, walls = 0, set(), time.monotonic(), []
    for i, (case, _) in enumerate(cases):
        if args.budget_s is not None and time.monotonic() - t0 + max(walls, default=CASE_S) > args.budget_s:
            print(f"[perf] budget: {args.budget_s:.0f} s would be exceeded; not started: "
                  f"{', '.join(c.name for c, _ in cases[i:])}", flush=True)
            break
        [(case, rc, run_dir, wall)] = run_cases.run_batch([case], args.out, GPUS)
        walls.append(wall)
        row = run_cases.record(case, rc, run_dir, wall, args.results, config=run_cases.overrides(case),
                               runner="python benchmarks/perf_h200x2.py --sweep " + " ".join(args.sweep))
        failed += row is None
        ran |= {case.name} if row else set()
    mock_ratio_row(ran, args.results)
    return 1 if failed else 0
