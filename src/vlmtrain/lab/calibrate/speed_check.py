"""Fit and check vlmtrain.check.speed (the step-time model) on the project's measured rows; compare it with
published figures.

    vlmtrain lab calibrate-speed [--fit] [--measured results/perf_h200.jsonl ...]
        [--out results/speed_estimates.jsonl]
    vlmtrain lab calibrate-speed --table      # the error table of the written jsonl
    vlmtrain lab calibrate-speed --published  # predicted vs Megatron Bridge's published H100 figures

Every finished single `train.py` run of the measured files with a step time is composed from its own overrides
(placed as train.py places it when it ran after the auto defaults landed, else unplaced: what those runs ran) and
grouped with the runs of the same command on the same GPU kind; a group's step time is the median of its runs.
BF16 runs only (FP8's rates are not fitted), no profiled steps, no user-file data (`<inputs>`). A group's workload
is its own where the row says it (useful and padded tokens per step, flops_* per tower), else the plan's
(check.speed.workload.planned over the same data).

Rows are split once by a stable hash of the group's name: two thirds fit the constants (`--fit` writes
check/speed/calibration.json with the commit, this command and both lists of rows), one third is held out; the
printed table gives each group's error and the held-out median absolute error with the worst case by name. The fit
minimises the log error of the step time and of the timer's components (vision, decoder, optimizer, the rest)
with scipy's bounded least squares.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import shlex
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmtrain.check import speed
from vlmtrain.check.speed import calibration
from vlmtrain.check.speed.calibration import Calibration
from vlmtrain.check.speed.workload import Workload, from_samples
from vlmtrain.config import architecture as arch
from vlmtrain.config import flops
from vlmtrain.config.compose import CONF_DIR, compose
from vlmtrain.config.resolve import Resolved, resolve
from vlmtrain.config.schema import RunConfig
from vlmtrain.lab.kit import experiments, store
from vlmtrain.lab.kit.case import Case

ROOT = CONF_DIR.parent
TARGET_PCT = 20.0
MEASURED = ("perf_h200", "perf_h200x2", "perf_h100", "gpu_training", "gpu_acceptance", "precision_h200")
AUTO_DEFAULTS_SINCE = "2026-12-05"
"""check.defaults (the auto options settled where a run is placed) landed that day (commit a9a2784): a run measured
before it ran what an unplaced resolve reads (FSDP, Bridge's kernels, no packing)."""
HELD_OUT_EVERY = 3
"""One group in three (by a stable hash of its name) is held out of the fit."""
DROPPED = ("dry_run=", "wandb.", "train.iterations=", "hydra.")
BENCHMARK_COMMAND = experiments.command(__name__)
COMPONENTS = {"vision": ("time_vision_s", "time_projector_s"), "decoder": ("time_decoder_s",),
              "optimizer": ("time_optimizer_s",), "other": ("time_other_s", "time_data_s")}
"""check.speed's components -> the timer's keys they are compared with (observe.timing)."""
BOUNDS = {
    "vit_fraction": (0.05, 0.9), "dense_fraction": (0.05, 0.9), "expert_fraction": (0.02, 0.9),
    "expert_gemm_s": (1e-7, 0.01), "expert_cutlass_gemm_s": (1e-7, 0.01),
    "hbm_fraction": (0.1, 1.0), "layer_host_s": (1e-4, 0.2), "gdn_layer_host_s": (1e-5, 1.0),
    "vit_block_host_s": (1e-5, 0.05), "fsdp_unit_host_s": (1e-5, 0.05), "image_host_s": (1e-5, 0.1),
    "microbatch_host_s": (1e-4, 0.5), "step_host_s": (1e-3, 0.5), "host_hidden": (0.0, 1.0),
}
"""The physical range of each constant: fractions of a peak, seconds per launch."""


def overrides(command: str) -> list[str] | None:
    """The train.py overrides of a recorded command (after `train.py`, `-m` dropped), without the ones that do not
    change a step (dry_run, W&B, iterations); None for a sweep over several values. The in-batch packing of the
    first 2 x H200 sweeps (`data.packing=true`: one THD row of each micro-batch's samples) is spelled as the packed
    row it was: `data.packing=<MBS x seq_length>` at that MBS."""
    args = shlex.split(command)
    if "train.py" not in args:
        return None
    out = [a for a in args[args.index("train.py") + 1:] if a != "-m" and not a.startswith(DROPPED)]
    if any("," in a.split("=", 1)[-1] and "[" not in a for a in out):
        return None
    if "data.packing=true" in out:
        values = dict(a.split("=", 1) for a in out if "=" in a)
        cap = int(values.get("train.micro_batch_size", 1)) * int(values.get("train.seq_length", 4096))
        out = [f"data.packing={cap}" if a == "data.packing=true" else a for a in out]
    return out


def usable(record: dict[str, Any]) -> bool:
    """A finished single BF16 train.py run with a step time: not profiled, no user files, no summary row."""
    m, cmd = record.get("metrics", {}), record.get("command", "")
    return (isinstance(cmd, str) and bool(m.get("step_s")) and m.get("rc", 0) == 0 and "superseded" not in record
            and overrides(cmd) is not None and "<inputs>" not in cmd and "profile_step" not in cmd
            and "precision=fp" not in cmd and "precision=mx" not in cmd and "precision=nv" not in cmd
            and not record["name"].endswith("_summary") and "summary_" not in record["name"])


def gpu_kind(machine: str) -> str:
    return "H100" if "H100" in machine else "H200" if "H200" in machine else machine


@dataclass
class Group:
    """The runs of one command on one GPU kind: the case they ran (named for the first run, with the kind)."""

    case: Case
    command: str
    kind: str
    date: str
    runs: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return self.case.name

    @property
    def step_s(self) -> float:
        return statistics.median(float(r["metrics"]["step_s"]) for r in self.runs)

    def component(self, keys: tuple[str, ...]) -> float | None:
        vals = [sum(float(r["metrics"].get(k, 0.0)) for k in keys) for r in self.runs
                if r["metrics"].get("time_decoder_s")]
        return statistics.median(vals) if vals else None

    @property
    def held_out(self) -> bool:
        return int(hashlib.sha1(self.name.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def machine_world(ov: list[str], machine: str) -> list[str]:
    """`gpus_per_node=N` from the row's machine ("1x NVIDIA H100 ...") where its overrides name no world: such a
    command ran on that machine's GPUs, not on the hardware group's default node of 8."""
    n = re.match(r"(\d+)x ", machine)
    if n is None or any(a.lstrip("+").startswith(("gpus_per_node=", "nodes=")) for a in ov):
        return []
    return [f"gpus_per_node={n.group(1)}"]


def groups(paths: list[Path]) -> list[Group]:
    """Every usable run, grouped by its overrides and GPU kind (a group's name: its first run's, with the kind)."""
    out: dict[str, Group] = {}
    for path in paths:
        for r in store.read(path) if path.is_file() else []:
            if not usable(r):
                continue
            ov = overrides(r["command"]) or []
            ov = [*ov, *machine_world(ov, r["machine"])]
            kind = gpu_kind(r["machine"])
            key = json.dumps([sorted(ov), kind])
            if key not in out:
                name = f"{r['name']} [{kind}]"
                taken = sum(g.name.startswith(name) for g in out.values())
                out[key] = Group(Case(f"{name} ({taken + 1})" if taken else name, overrides=ov), r["command"], kind,
                                 r["date"], [])
            out[key].runs.append(r)
    return list(out.values())


def composed(g: Group, cache_dir: Path) -> tuple[RunConfig, Resolved]:
    """The group's run as it ran: placed (check.defaults) when measured after the auto defaults landed."""
    run = compose([*g.case.overrides, f"data.cache_dir={cache_dir}"], output_dir=str(cache_dir / "compose"))
    if g.date >= AUTO_DEFAULTS_SINCE:
        from vlmtrain.check.defaults import placed

        return run, placed(run, 0)[1]
    return run, resolve(run)


def measured_workload(run: RunConfig, res: Resolved, metrics: dict[str, Any], plan: Workload) -> Workload:
    """The step a measured row ran: its useful and padded tokens and its FLOPs per tower (flops_*: real lengths,
    every image), samples and images in the proportions of the plan's workload of the same data; the plan's own
    where the row does not say."""
    gpus = res.layout.world_size
    if not metrics.get("flops_decoder") or not metrics.get("useful_tokens_per_s_per_gpu"):
        return plan
    step = float(metrics["step_s"])
    useful = float(metrics["useful_tokens_per_s_per_gpu"]) * step * gpus
    padded = float(metrics.get("padded_tokens_per_s_per_gpu") or metrics["useful_tokens_per_s_per_gpu"]) * step * gpus
    per_sample = plan.useful_tokens / plan.samples
    samples = useful / per_sample if res.packing_capacity else float(run.train.global_batch_size)
    images = plan.images / plan.samples * samples
    return Workload(samples=samples, useful_tokens=useful, decoder_tokens=max(padded, useful), images=images,
                    patches=plan.patches / max(plan.images, 1e-9) * images,
                    flops=flops.Flops(float(metrics.get("flops_vit", 0.0)), float(metrics.get("flops_projector", 0.0)),
                                      float(metrics["flops_decoder"])),
                    source="the measured row's tokens and FLOPs")


@dataclass
class Composed:
    """A group composed, with the workload it is predicted for."""

    group: Group
    run: RunConfig
    res: Resolved
    workload: Workload

    def predict(self, cal: Calibration) -> speed.StepTime:
        return speed.predict(self.run, self.res, self.workload, cal)


def inbatch_plan(run: RunConfig, res: Resolved, plan: Workload) -> Workload:
    """The plan's workload of an in-batch packed run (data.packing=true as it ran): train.global_batch_size samples
    of the data's mean length, each micro-batch's MBS samples one row."""
    mbs = run.train.micro_batch_size
    per_sample = plan.useful_tokens / plan.samples
    images = plan.images / plan.samples
    per_image = plan.patches / max(plan.images, 1e-9) / arch.PATCHES_PER_TOKEN
    return from_samples(run, res, float(run.train.global_batch_size), per_sample, images, per_image, float(mbs),
                        plan.source + "; in-batch packed rows of MBS samples")


def cases(gs: list[Group], cache_dir: Path) -> list[Composed]:
    out = []
    for g in gs:
        run, res = composed(g, cache_dir)
        plan = speed.planned(run, res)
        if "data.packing=true" in shlex.split(g.command):
            plan = inbatch_plan(run, res, plan)
        metrics = {**g.runs[0]["metrics"], "step_s": g.step_s}
        out.append(Composed(g, run, res, measured_workload(run, res, metrics, plan)))
    return out


def residuals(cs: list[Composed], cal: Calibration) -> list[float]:
    """Log errors of each case's step time (weight 2) and of its measured components (each against the step: a
    component is compared on log((pred + 5 % step) / (measured + 5 % step)))."""
    out = []
    for c in cs:
        t = c.predict(cal)
        measured = c.group.step_s
        out.append(2 * math.log(t.step_s / measured))
        comps = t.components()
        for name, keys in COMPONENTS.items():
            value = c.group.component(keys)
            if value is not None:
                eps = 0.05 * measured
                out.append(math.log((comps[name] + eps) / (value + eps)))
    return out


def fit(cs: list[Composed], start: Calibration) -> Calibration:
    """The constants that minimise `residuals` on `cs`, within BOUNDS (log-scaled parameters)."""
    import numpy as np
    from scipy.optimize import least_squares

    names = Calibration.names()
    lo = np.log([BOUNDS[n][0] + 1e-6 for n in names])
    hi = np.log([BOUNDS[n][1] + 1e-6 for n in names])
    x0 = np.clip(np.log([getattr(start, n) + 1e-6 for n in names]), lo + 1e-9, hi - 1e-9)

    def cal_of(x: Any) -> Calibration:
        return Calibration(**{n: float(math.exp(v) - 1e-6) for n, v in zip(names, x, strict=True)})

    result = least_squares(lambda x: residuals(cs, cal_of(x)), x0, bounds=(lo, hi), x_scale="jac")
    return cal_of(result.x)


def error_pct(predicted: float, measured: float) -> float:
    return round(100.0 * (predicted - measured) / measured, 1)


def row(c: Composed, cal: Calibration) -> dict[str, Any]:
    """The results row of one group: measured (median, runs, min-max) vs predicted, the breakdown, the split."""
    t = c.predict(cal)
    g = c.group
    steps = [float(r["metrics"]["step_s"]) for r in g.runs]
    comps = {f"measured_{k}_s": round(v, 4) for k in COMPONENTS if (v := g.component(COMPONENTS[k])) is not None}
    metrics = {"measured_step_s": round(g.step_s, 4), "measured_step_s_min": round(min(steps), 4),
               "measured_step_s_max": round(max(steps), 4), "runs": len(steps),
               "predicted_step_s": round(t.step_s, 4), "error_pct": error_pct(t.step_s, g.step_s),
               **comps, **{f"predicted_{k}_s": round(v, 4) for k, v in t.components().items()}}
    return store.row(g.name, {"benchmark": BENCHMARK_COMMAND, "gpu": g.command}, metrics,
                     machine=g.runs[0]["machine"], machine_run=g.runs[0].get("machine_run"), measured_date=g.date,
                     split="held_out" if g.held_out else "fit", workload=c.workload.source,
                     breakdown=t.to_dict())


def median_abs(rows: list[dict[str, Any]]) -> float:
    return statistics.median(abs(r["metrics"]["error_pct"]) for r in rows) if rows else float("nan")


def summary(rows: list[dict[str, Any]]) -> str:
    """The held-out median absolute error with the worst case by name, then the fitted rows' median."""
    held = [r for r in rows if r["split"] == "held_out"]
    fitted = [r for r in rows if r["split"] == "fit"]
    out = "held out: none"
    if held:
        worst = max(held, key=lambda r: abs(r["metrics"]["error_pct"]))
        within = sum(abs(r["metrics"]["error_pct"]) <= TARGET_PCT for r in held)
        out = (f"held out: {len(held)} groups, median |error| {median_abs(held):.1f} % ({within} within "
               f"{TARGET_PCT:.0f} %); worst {worst['name']} {worst['metrics']['error_pct']:+.1f} %")
    return out + f"; fitted: {len(fitted)} groups, median |error| {median_abs(fitted):.1f} %"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The error table (docs/performance.md), generated from the jsonl rows so the two agree."""
    out = ["| group | set | runs | measured s (min-max) | predicted s | error % | workload |",
           "|---|---|---:|---:|---:|---:|---|"]
    for r in sorted(rows, key=lambda r: (r["split"], r["name"])):
        m = r["metrics"]
        mark = " **(> 20 %)**" if abs(m["error_pct"]) > TARGET_PCT else ""
        out.append(f"| {r['name']} | {r['split']} | {m['runs']} | {m['measured_step_s']:.2f} "
                   f"({m['measured_step_s_min']:.2f}-{m['measured_step_s_max']:.2f}) | {m['predicted_step_s']:.2f} | "
                   f"{m['error_pct']:+.1f}{mark} | {'row' if r['workload'].startswith('the measured') else 'plan'} |")
    return "\n".join(out) + "\n\n" + summary(rows) + "\n"


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_calibration(cal: Calibration, rows: list[dict[str, Any]], path: Path = calibration.PATH) -> None:
    """calibration.json: the constants, the commit and command they came from, the rows fitted and held out."""
    held = [r for r in rows if r["split"] == "held_out"]
    worst = max(held, key=lambda r: abs(r["metrics"]["error_pct"]))
    src = {"commit": commit(), "command": f"{BENCHMARK_COMMAND} --fit", "measured": [f"results/{n}.jsonl"
                                                                                    for n in MEASURED],
           "fit_rows": [r["name"] for r in rows if r["split"] == "fit"], "held_out_rows": [r["name"] for r in held],
           "held_out_median_abs_error_pct": round(median_abs(held), 1),
           "held_out_worst": {"name": worst["name"], "error_pct": worst["metrics"]["error_pct"]}}
    constants = {k: float(f"{v:.4g}") for k, v in cal.to_dict().items()}
    path.write_text(json.dumps({"constants": constants, "source": src}, indent=1) + "\n")
    calibration.source.cache_clear()


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--measured", type=Path, nargs="+", default=[ROOT / "results" / f"{n}.jsonl" for n in MEASURED])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "speed_estimates.jsonl")
    ap.add_argument("--cache-dir", type=Path, default=ROOT / "outputs" / "speed_check_cache",
                    help="where the runs' datasets and processor are materialized (the plan's workload)")
    ap.add_argument("--fit", action="store_true", help="fit the constants on the fit rows and write calibration.json")
    ap.add_argument("--table", action="store_true", help="print the markdown error table of --out and exit")
    ap.add_argument("--published", action="store_true", help="print predicted vs published H100 figures and exit")


def run(args: argparse.Namespace) -> int:
    if args.table:
        print(markdown_table(store.read(args.out)), end="")
        return 0
    if args.published:
        from vlmtrain.lab.calibrate import speed_published

        print(speed_published.markdown_table(calibration.load()), end="")
        return 0
    gs = groups(args.measured)
    print(f"[calibrate-speed] {len(gs)} groups of {sum(len(g.runs) for g in gs)} runs; composing them and their "
          "data's workload (a minute per dataset the first time)", flush=True)
    cs = cases(gs, args.cache_dir.absolute())
    cal = calibration.load()
    if args.fit:
        cal = fit([c for c in cs if not c.group.held_out], cal)
    rows = [row(c, cal) for c in cs]
    store.rewrite(args.out, rows)
    if args.fit:
        write_calibration(cal, rows)
        print(f"[calibrate-speed] wrote {calibration.PATH}: " + json.dumps(calibration.source()["constants"]))
    print(markdown_table(rows), end="")
    return 0
