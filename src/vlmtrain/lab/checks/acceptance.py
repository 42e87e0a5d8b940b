"""The GPU acceptance suite: every path a new user takes, run through `python train.py` on one GPU node.

    vlmtrain lab acceptance [--only NAME ...] [--out DIR] [--results results/gpu_acceptance.jsonl]
    pytest -m gpu tests/gpu/test_acceptance.py         # the same cases, asserted

Cases are data (CASES): the three models, every data kind from real files (made here from the shipped photos, as
`vlmtrain data export` writes them), bad images with and without `data.skip_bad_images`, and a real `-m` sweep with
its report. Cases run side by side on the one GPU (the tiny ones need a few GiB each, so their timings are not
performance figures); `exclusive` cases run alone. Each finished case appends one row to the results file (name,
command, date, machine, rc, metrics) and `verdict()` says what it expected and did not see.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmtrain.lab.kit import baselines, experiments, runner, store
from vlmtrain.lab.kit.baselines import INPUTS
from vlmtrain.lab.kit.case import Case
from vlmtrain.observe import run_summary


@dataclass(frozen=True)
class Expected:
    """A case of the suite (one GPU; a sweep's world is its node's, as a user leaves it) and what its run must end
    with: `rc`, and `expect`: skipped_samples N, message (a regex the output must match), sweep_jobs N (a `-m`
    sweep, checked by its preflight.json and report), max_first_step_s. `exclusive` ones run alone, the rest side by
    side."""

    case: Case
    rc: int = 0
    expect: dict[str, Any] = field(default_factory=dict)
    exclusive: bool = False

    @property
    def name(self) -> str:
        return self.case.name


def path(name: str, overrides: list[str], rc: int = 0, exclusive: bool = False, multirun: bool = False,
         **expect: Any) -> Expected:
    return Expected(Case(name, None if multirun else 1, overrides, multirun=multirun), rc, expect, exclusive)


TINY = [*baselines.TINY, *baselines.steps(10)]
SHAPE_30B = [*baselines.SHAPE_30B, *baselines.steps(8)]
SHAPE_35 = [*baselines.SHAPE_35, *baselines.steps(6)]
SHAPE_235B = [*baselines.SHAPE_235B, *baselines.steps(6)]
CASES = [
    path("tiny_sample", TINY),
    path("tiny_realistic", [*TINY, "data=realistic"]),
    path("tiny_jsonl", [*TINY, "data=jsonl", f"data.path={INPUTS}/jsonl/data.jsonl"]),
    path("tiny_parquet", [*TINY, "data=parquet", f"data.path={INPUTS}/parquet/data.parquet"]),
    path("tiny_hf", [*TINY, "data=hf", f"data.path={INPUTS}/hf"]),
    path("tiny_energon", [*TINY, "data=energon", f"data.path={INPUTS}/energon"]),
    path("tiny_mock", [*TINY, "data=mock"]),
    path("tiny_parquet_bad_skipped", [*TINY, "data=parquet", f"data.path={INPUTS}/parquet_bad/data.parquet",
                                      "data.skip_bad_images=true"], skipped_samples=2),
    path("tiny_parquet_bad_refused", [*TINY, "data=parquet", f"data.path={INPUTS}/parquet_bad/data.parquet"], rc=2,
         message=r"parquet_bad/data\.parquet.*row \d+"),
    path("tiny_sweep_mbs", ["train.micro_batch_size=1,2", "train.iterations=6"], multirun=True, sweep_jobs=2),
    path("30b-shape-l4_realistic", SHAPE_30B, exclusive=True),
    # beside the tiny cases: its first run is mostly TileLang's kernel JIT (minutes), which the next case must skip
    path("qwen35-l4_first-run", SHAPE_35),
    path("qwen35-l4_second-run", SHAPE_35, exclusive=True, max_first_step_s=60.0),
    path("235b-l1_realistic", SHAPE_235B, exclusive=True),
    # the kernels group on Qwen3.5: CUTLASS experts, fused router, TE cross entropy and RoPE, host ViT positions
    path("qwen35-l4_kernels-fast", [*SHAPE_35, "kernels=fast"]),
    path("qwen35-l4_packing_refused", [*SHAPE_35, "data.packing=8192"], rc=2, message="qwen35_packing_unverified"),
]


CASE_FILE = "case.json"
"""The case's results row, written into its run dir too: a recorded run dir then holds its exit status."""


def recorded_rc(run_dir: Path) -> int:
    """The exit status the suite recorded for a run dir (its case.json), which the run's own files do not hold."""
    return json.loads((run_dir / CASE_FILE).read_text())["metrics"]["rc"]


def outcome(e: Expected, rc: int, run_dir: Path, wall_s: float) -> dict[str, Any]:
    """What the case's run dir says: rc, summary metrics, skipped samples, first step time, checks, sweep report."""
    log = (run_dir / "train.log").read_text(errors="replace")
    job_dirs = sorted(p.parent for p in run_dir.glob("*/metrics.jsonl")) if e.case.multirun else [run_dir]
    rows = run_summary.read_jsonl(job_dirs[0] / "metrics.jsonl") if job_dirs else []
    summary = run_summary.summarize(job_dirs[0]) if job_dirs else {}
    metrics: dict[str, Any] = {k: summary[k] for k in ("steps", "first_loss", "last_loss", "mfu", "peak_mem_gib",
                                                       "step_s", "useful_tokens_per_s_per_gpu") if k in summary}
    if rows:
        metrics["first_step_s"] = rows[0].get("step_s")
        metrics["skipped_samples"] = rows[-1].get("skipped_samples", 0)
    checks_file = job_dirs[0] / "checks.json" if job_dirs else run_dir / "checks.json"
    out: dict[str, Any] = {"rc": rc, "wall_s": round(wall_s, 1), "metrics": metrics,
                           "checks": json.loads(checks_file.read_text()) if checks_file.exists() else {},
                           "log_tail": log[-3000:]}
    if e.case.multirun:
        pre = run_dir / "preflight.json"
        out["sweep"] = {"jobs_with_metrics": len(job_dirs),
                        "preflight": json.loads(pre.read_text()) if pre.exists() else None,
                        "report": sorted(p.name for p in run_dir.iterdir() if p.suffix in (".md", ".csv", ".png"))}
    return out


def verdict(e: Expected, got: dict[str, Any]) -> list[str]:
    """What the case expected and did not see (empty: it passed)."""
    problems: list[str] = []
    m, want = got["metrics"], e.expect
    if got["rc"] != e.rc:
        problems.append(f"rc {got['rc']}, expected {e.rc}")
    if "message" in want and not re.search(want["message"], got["log_tail"]):
        problems.append(f"output does not match {want['message']!r}")
    if e.rc == 0:
        if not (m.get("first_loss") and m.get("last_loss") and m["last_loss"] < m["first_loss"]):
            problems.append(f"loss did not fall: {m.get('first_loss')} -> {m.get('last_loss')}")
        if not m.get("mfu") or not m.get("peak_mem_gib"):
            problems.append("no mfu / peak_mem_gib recorded")
        if got["checks"].get("dispatcher_classes") != ["MoEAlltoAllTokenDispatcher"]:
            problems.append(f"dispatcher_classes {got['checks'].get('dispatcher_classes')}")
    if "skipped_samples" in want and m.get("skipped_samples") != want["skipped_samples"]:
        problems.append(f"skipped_samples {m.get('skipped_samples')}, expected {want['skipped_samples']}")
    if "max_first_step_s" in want and not (m.get("first_step_s") or 1e9) <= want["max_first_step_s"]:
        problems.append(f"first step {m.get('first_step_s')} s > {want['max_first_step_s']} s (JIT not cached?)")
    if "sweep_jobs" in want:
        sw = got.get("sweep") or {}
        pre = sw.get("preflight") or {}
        if len(pre.get("launched", [])) != want["sweep_jobs"] or pre.get("skipped"):
            problems.append(f"sweep preflight launched {len(pre.get('launched', []))}, skipped {pre.get('skipped')}")
        if sw.get("jobs_with_metrics") != want["sweep_jobs"]:
            problems.append(f"{sw.get('jobs_with_metrics')} sweep job(s) wrote metrics")
        if not {"report.md", "report.csv"} <= set(sw.get("report", [])) or not any(
                p.endswith(".png") for p in sw.get("report", [])):
            problems.append(f"sweep report files: {sw.get('report')}")
    return problems


def run_cases(selected: list[Expected], out: Path, results_path: Path, inputs: Path,
              commit: str) -> dict[str, list[str]]:
    """Run the cases (side-by-side ones first, then each exclusive one alone); one results row per case."""
    baselines.export_inputs(inputs)
    problems: dict[str, list[str]] = {}
    batches = [[e for e in selected if not e.exclusive], *([e] for e in selected if e.exclusive)]
    for batch in (b for b in batches if b):
        started = [(e, runner.start(baselines.with_inputs(e.case, inputs), out / e.name, fresh=True)) for e in batch]
        for e, started_run in started:
            rc, run_dir = started_run.wait(), started_run.run_dir
            got = outcome(e, rc, run_dir, started_run.wall_s())
            problems[e.name] = verdict(e, got)
            metrics = {"rc": got["rc"], **got["metrics"], "wall_s": got["wall_s"]}
            command = runner.recorded(baselines.with_inputs(e.case, "<inputs>"))
            row = store.append(results_path, e.name, command, metrics, commit=commit,
                               ok=not problems[e.name], problems=problems[e.name],
                               side_by_side=[b.name for b in batch] if len(batch) > 1 else [],
                               **({"sweep": got["sweep"]} if e.case.multirun else {}))
            (run_dir / CASE_FILE).write_text(json.dumps(row, indent=1) + "\n")  # the run dir keeps its own row
            print(f"[acceptance] {e.name}: {'ok' if not problems[e.name] else problems[e.name]} "
                  f"{json.dumps(metrics)}", flush=True)
    return problems


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", nargs="*", help="case names (substring match)")
    experiments.add_out(ap, "acceptance")
    experiments.add_results(ap, "gpu_acceptance.jsonl")
    experiments.add_commit(ap)


def run(args: argparse.Namespace) -> int:
    selected = [c for c in CASES if not args.only or any(s in c.name for s in args.only)]
    problems = run_cases(selected, args.out, args.results, args.out / "inputs", args.commit)
    return 1 if any(problems.values()) else 0
