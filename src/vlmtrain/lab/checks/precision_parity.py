"""FP8 recipes vs BF16 on one H200: loss parity over 100+ steps, then speed and peak memory at equal useful work.

    vlmtrain lab precision-parity parity [--only NAME ...]          # one 100-step run per recipe
    vlmtrain lab precision-parity speed --repeats 3 [--only NAME ...]  # short runs, 3 per recipe and machine run
    vlmtrain lab precision-parity summarize                          # medians, ratios, parity -> rows

Every run is `python train.py` on the 30B-A3B layer shapes at 4 decoder layers, real images (data=realistic), MBS 1, GBS
1, the same seed and data order for every recipe, one run after another. Run dirs go under outputs/precision/<machine
run>/<mode>/<recipe>-<i> (case.json: rc, command, the machine and the machine run,
vlmtrain.lab.kit.store.machine_run), through vlmtrain.lab.kit.schedule: `--repeats N` runs of each recipe per mode and
machine run, those already in the run dirs not run again; `summarize` (on any machine) appends to
results/precision_h200.jsonl one row per run and one summary row per recipe and machine run: the median of its speed
runs' steady step_s / useful tokens/s with the min-max spread, the speed ratio against BF16's median on the same machine
run and samples, the peak memory of all its runs, and the loss parity of its 100-step run against BF16's: the largest
absolute difference of the two loss curves after a centred moving average (PARITY_WINDOW).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from vlmtrain.lab.kit import baselines, experiments, runner, schedule, store
from vlmtrain.lab.kit.case import Case
from vlmtrain.lab.kit.runner import ROOT
from vlmtrain.observe import run_summary

OUT = ROOT / "outputs" / "precision"
BASE = [*baselines.SHAPE_30B, "train.micro_batch_size=1", "train.global_batch_size=1"]
RECIPES = [Case("bf16", 1, [*BASE, "precision=bf16"]), Case("fp8-tensorwise", 1, [*BASE, "precision=fp8"]),
           Case("fp8-blockwise", 1, [*BASE, "precision=fp8", "precision.scaling=blockwise"]),
           Case("fp8-delayed", 1, [*BASE, "precision=fp8", "precision.scaling=delayed"])]
"""One case per recipe, named by it; a run adds its mode's iterations."""
STEPS = {"parity": 100, "speed": 10}
PARITY_WINDOW = 10
"""Steps in the moving average the loss curves are compared after (single-sample steps are noisy)."""
PARITY_TOLERANCE_NATS = 0.05
"""The largest smoothed-loss difference accepted as parity, fixed before the first run: about 1 % of the loss
(~4.5 nats) these runs reach at step 100."""


def recorded(where: Path, recipe: Case) -> int:
    """The runs of a recipe a mode's folder of one machine run holds (each a case.json)."""
    return sum(1 for _ in where.glob(f"{recipe.name}-*/case.json"))


def run_case(recipe: Case, mode: str, i: int, where: Path, machine_run: str) -> bool:
    """Run i of a recipe in a mode (its iterations), into where/<recipe>-<i> with its case.json; whether it
    exited 0."""
    case = recipe.plus(f"train.iterations={STEPS[mode]}")
    run = runner.start(case, where / f"{recipe.name}-{i}")
    rc = run.wait()
    meta = {"mode": mode, "recipe": recipe.name, "i": i, "rc": rc, "wall_s": round(run.wall_s(), 1),
            "command": runner.recorded(case), "machine": store.machine(), "machine_run": machine_run}
    (run.run_dir / "case.json").write_text(json.dumps(meta))
    print(f"[precision] {mode} {recipe.name} #{i}: rc {rc}, {meta['wall_s']} s", flush=True)
    return rc == 0


def smoothed(losses: list[float], window: int = PARITY_WINDOW) -> list[float]:
    half = window // 2
    return [statistics.fmean(losses[max(0, i - half):i + half + 1]) for i in range(len(losses))]


def parity(a: list[float], b: list[float]) -> float:
    n = min(len(a), len(b))
    return max(abs(x - y) for x, y in zip(smoothed(a[:n]), smoothed(b[:n]), strict=True))


FIRST_MACHINE_RUN = "boot-1"
"""The machine run of the runs made before case.json recorded one (all on one machine run of 2026-12-01)."""


def row_name(name: str, where: str) -> str:
    """A results row's name: the first machine run's rows keep the names they were first written under."""
    return name if where == FIRST_MACHINE_RUN else f"{name}_{where}"


def summarize(path: Path, commit: str, machine_runs: list[str] | None = None, run_rows: bool = True) -> None:
    """Rows for the runs (unless not `run_rows`) and the per-recipe summaries of `machine_runs` (default all). Speed
    comes from the speed runs only: the data order follows train.iterations, so a 100-step parity run trains on
    other samples in its first steps than a 10-step run, and equal useful work means equal iterations. The BF16
    loss curve for parity is read from any machine run (the loss does not depend on the machine)."""
    runs: dict[tuple[str, str], list[tuple[dict, dict, list[float]]]] = {}
    for case in sorted(OUT.glob("**/case.json")):
        meta = json.loads(case.read_text())
        meta.setdefault("machine_run", FIRST_MACHINE_RUN)
        rows = run_summary.read_jsonl(case.parent / "metrics.jsonl") if (case.parent / "metrics.jsonl").exists() else []
        # steady_nonpad_tokens: the counted steps' real tokens, equal for two runs only if they saw the same samples
        summary = {**run_summary.summarize_rows(rows), "steady_nonpad_tokens": sum(r.get("nonpad_tokens", 0)
                   for r in run_summary.steady(rows))} if rows else {}
        losses = [r["lm_loss"] for r in rows if isinstance(r.get("lm_loss"), int | float)]
        runs.setdefault((meta["machine_run"], meta["recipe"]), []).append((meta, summary, losses))
        if run_rows and (not machine_runs or meta["machine_run"] in machine_runs):
            name = row_name(f"30b-shape-l4_{meta['recipe']}_{meta['mode']}-{meta['i']}", meta["machine_run"])
            store.append(path, name, meta["command"], {"rc": meta["rc"], **summary}, commit=commit,
                         wall_s=meta["wall_s"], machine=meta["machine"], machine_run=meta["machine_run"])
    # a run stopped before its last step (rc != 0) still counts with the steps it made; the row says so
    ok = {k: [(m, s, losses) for m, s, losses in v if s.get("steps", 0) > run_summary.SKIP] for k, v in runs.items()}
    base_loss = next((losses for (_, r), v in ok.items() if r == "bf16" for m, _, losses in v
                      if m["mode"] == "parity"), None)
    for (where, recipe), done in ok.items():
        if machine_runs and where not in machine_runs:
            continue
        metrics = {"peak_mem_gib": max(s["peak_mem_gib"] for _, s, _ in done)}
        metrics |= speed([s for m, s, _ in done if m["mode"] == "speed"],
                         [s for m, s, _ in ok.get((where, "bf16"), []) if m["mode"] == "speed"])
        mine = next((losses for m, _, losses in done if m["mode"] == "parity"), None)
        if base_loss and mine and recipe != "bf16":
            metrics.update(loss_parity_max_abs_diff_nats=parity(base_loss, mine), parity_steps=min(len(base_loss),
                           len(mine)), parity_window=PARITY_WINDOW, parity_tolerance_nats=PARITY_TOLERANCE_NATS)
        store.append(path, row_name(f"30b-shape-l4_{recipe}_summary", where),
                       f"{experiments.command(__name__)} summarize", metrics, commit=commit,
                       recipe=recipe,
                       machine=done[0][0]["machine"], machine_run=where)
        print(f"[precision] {recipe} ({where}): {json.dumps(metrics)}", flush=True)


def speed(timed: list[dict], bf16: list[dict]) -> dict[str, object]:
    """Median and min-max of the speed runs, and the ratio to BF16's median on the same machine run and samples."""
    if not timed:
        return {}
    out: dict[str, object] = {
        "speed_runs": len(timed),
        **schedule.spread([s["useful_tokens_per_s_per_gpu"] for s in timed], "useful_tokens_per_s_per_gpu"),
        **schedule.spread([s["step_s"] for s in timed], "step_s"),
        "mfu": statistics.median(s["mfu"] for s in timed),
        "mfu_precision_peak": statistics.median(s["mfu_precision_peak"] for s in timed)}
    if bf16 and {s["steady_nonpad_tokens"] for s in timed} == {s["steady_nonpad_tokens"] for s in bf16}:
        out["speed_ratio_vs_bf16"] = out["useful_tokens_per_s_per_gpu"] / statistics.median(
            s["useful_tokens_per_s_per_gpu"] for s in bf16)
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("mode", choices=["parity", "speed", "summarize"])
    ap.add_argument("--only", nargs="*", default=[c.name for c in RECIPES])
    schedule.add_flags(ap, 1, "recipe", tag=False)
    ap.add_argument("--machine-run", nargs="*", help="parity, speed: the machine run these runs belong to (one tag; "
                    "default: this host and GPUs' batch in outputs/precision, else a new one); summarize: write rows "
                    "for these machine runs only")
    ap.add_argument("--summaries-only", action="store_true", help="summarize: no per-run rows")
    experiments.add_results(ap, "precision_h200.jsonl")
    experiments.add_commit(ap)


def run(args: argparse.Namespace) -> int:
    if args.mode == "summarize":
        summarize(args.results, args.commit, args.machine_run, run_rows=not args.summaries_only)
        return 0
    seen = sorted(p.name for p in OUT.iterdir()) if OUT.is_dir() else []
    machine_run = store.machine_run((args.machine_run or [None])[0], seen)
    where = OUT / machine_run / args.mode
    recipes = [c for c in RECIPES if c.name in args.only]
    todo = schedule.pending(recipes, args.repeats, lambda c: recorded(where, c), "precision", machine_run)
    failed = schedule.run(todo, lambda c, i: run_case(c, args.mode, i, where, machine_run), repeats=args.repeats,
                          tag="precision", machine_run=machine_run, budget_s=args.budget_s)
    return int(bool(failed))
