"""FP8 recipes vs BF16 on one H200: loss parity over 100+ steps, then speed and peak memory at equal useful work.

    python benchmarks/precision_h200.py parity [--only NAME ...]          # one 100-step run per recipe
    python benchmarks/precision_h200.py speed --repeats 2 [--only NAME ...]  # more short runs per recipe
    python benchmarks/precision_h200.py summarize                          # medians, ratios, parity -> rows

Every run is `python train.py` on the 30B-A3B layer shapes at 4 decoder layers, real images (data=realistic),
MBS 1, GBS 1, the same seed and data order for every recipe, run one after another (never side by side). Run dirs
go under outputs/precision/<mode>/<recipe>-<i> (case.json: rc, command and the GPU machine); `summarize` (on
any machine) appends to results/precision_h200.jsonl one row per
run and one summary row per recipe: the median of its runs' steady step_s / useful tokens/s with the min-max
spread, the speed ratio against BF16's median, the peak memory, and the loss parity of its 100-step run against
BF16's: the largest absolute difference of the two loss curves after a centred moving average (PARITY_WINDOW).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from vlmtrain.observe import results

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "precision"
BASE = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "train.micro_batch_size=1",
        "train.global_batch_size=1", "gpus_per_node=1", "wandb.enabled=false"]
RECIPES = {"bf16": ["precision=bf16"], "fp8-tensorwise": ["precision=fp8"],
           "fp8-blockwise": ["precision=fp8", "precision.scaling=blockwise"]}
STEPS = {"parity": 100, "speed": 10}
PARITY_WINDOW = 10
"""Steps in the moving average the loss curves are compared after (single-sample steps are noisy)."""
PARITY_TOLERANCE_NATS = 0.05
"""The largest smoothed-loss difference accepted as parity, fixed before the first run: about 1 % of the loss
(~4.5 nats) these runs reach at step 100."""


def run_case(mode: str, recipe: str, i: int) -> dict[str, object]:
    run_dir = OUT / mode / f"{recipe}-{i}"
    overrides = [*BASE, *RECIPES[recipe], f"train.iterations={STEPS[mode]}"]
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with (run_dir / "train.log").open("wb") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1")).returncode
    meta = {"mode": mode, "recipe": recipe, "i": i, "rc": rc, "wall_s": round(time.time() - t0, 1),
            "command": "python train.py " + " ".join(overrides), "machine": results.machine()}
    (run_dir / "case.json").write_text(json.dumps(meta))
    print(f"[precision] {mode} {recipe} #{i}: rc {rc}, {meta['wall_s']} s", flush=True)
    return meta


def smoothed(losses: list[float], window: int = PARITY_WINDOW) -> list[float]:
    half = window // 2
    return [statistics.fmean(losses[max(0, i - half):i + half + 1]) for i in range(len(losses))]


def parity(a: list[float], b: list[float]) -> float:
    n = min(len(a), len(b))
    return max(abs(x - y) for x, y in zip(smoothed(a[:n]), smoothed(b[:n]), strict=True))


def summarize(path: Path, commit: str) -> None:
    runs: dict[str, list[tuple[dict, dict, list[float]]]] = {}
    for case in sorted(OUT.glob("*/*/case.json")):
        meta = json.loads(case.read_text())
        rows = results.read_jsonl(case.parent / "metrics.jsonl") if (case.parent / "metrics.jsonl").exists() else []
        summary = results.summarize(case.parent) if rows else {}
        losses = [r["lm_loss"] for r in rows if isinstance(r.get("lm_loss"), int | float)]
        runs.setdefault(meta["recipe"], []).append((meta, summary, losses))
        results.append(path, f"30b-shape-l4_{meta['recipe']}_{meta['mode']}-{meta['i']}", meta["command"],
                       {"rc": meta["rc"], **summary}, commit=commit, wall_s=meta["wall_s"], machine=meta["machine"])
    # a run stopped before its last step (rc != 0) still counts with the steps it made; the row says so
    ok = {r: [(m, s, losses) for m, s, losses in v if s.get("steps", 0) > results.SKIP] for r, v in runs.items()}
    base_loss = next((losses for m, _, losses in ok.get("bf16", []) if m["mode"] == "parity"), None)
    bf16 = ok.get("bf16") or []
    base_rate = statistics.median(s["useful_tokens_per_s_per_gpu"] for _, s, _ in bf16) if bf16 else None
    for recipe, done in ok.items():
        if not done:
            continue
        rates = [s["useful_tokens_per_s_per_gpu"] for _, s, _ in done]
        steps = [s["step_s"] for _, s, _ in done]
        metrics = {"runs": len(done), "incomplete_runs": sum(m["rc"] != 0 for m, _, _ in done),
                   "useful_tokens_per_s_per_gpu": statistics.median(rates),
                   "useful_tokens_per_s_per_gpu_min": min(rates), "useful_tokens_per_s_per_gpu_max": max(rates),
                   "step_s": statistics.median(steps), "step_s_min": min(steps), "step_s_max": max(steps),
                   "peak_mem_gib": max(s["peak_mem_gib"] for _, s, _ in done),
                   "mfu": statistics.median(s["mfu"] for _, s, _ in done),
                   "mfu_precision_peak": statistics.median(s["mfu_precision_peak"] for _, s, _ in done)}
        if base_rate:
            metrics["speed_ratio_vs_bf16"] = metrics["useful_tokens_per_s_per_gpu"] / base_rate
        mine = next((losses for m, _, losses in done if m["mode"] == "parity"), None)
        if base_loss and mine and recipe != "bf16":
            metrics.update(loss_parity_max_abs_diff_nats=parity(base_loss, mine), parity_steps=min(len(base_loss),
                           len(mine)), parity_window=PARITY_WINDOW, parity_tolerance_nats=PARITY_TOLERANCE_NATS)
        results.append(path, f"30b-shape-l4_{recipe}_summary", "python benchmarks/precision_h200.py summarize",
                       metrics, commit=commit, recipe=recipe, machine=done[0][0]["machine"])
        print(f"[precision] {recipe}: {json.dumps(metrics)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["parity", "speed", "summarize"])
    ap.add_argument("--only", nargs="*", default=list(RECIPES))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "precision_h200.jsonl")
    ap.add_argument("--commit", default=os.environ.get("VLMTRAIN_COMMIT", "unknown"))
    args = ap.parse_args(argv)
    if args.mode == "summarize":
        summarize(args.results, args.commit)
        return 0
    metas = [run_case(args.mode, r, i) for i in range(args.repeats) for r in args.only]
    return int(any(m["rc"] for m in metas))


if __name__ == "__main__":
    sys.exit(main())
