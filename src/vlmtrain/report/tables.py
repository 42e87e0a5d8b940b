"""report.md (ranked tables per section, then the jobs that did not finish) and report.csv (one row per job)."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path
from typing import Any

from vlmtrain.config.groups import CHOSEN
from vlmtrain.observe.run_summary import FLOP_KEYS, SKIP, TIME_KEYS
from vlmtrain.report.job import SECTIONS, STATUS, Job
from vlmtrain.report.labels import baseline, describe, flags, layout_text, shown_elsewhere, split_kind, split_text
from vlmtrain.report.plots import PLOTS, VALIDATION_PLOT
from vlmtrain.report.sources import load_yaml

CSV_COLUMNS = ["section", "rank", "job", "num", "source", "status", "reason", "description", *CHOSEN, "layout",
               "gpus", "tp", "pp", "ep", "mbs", "frozen_vision", "mock_data", "steps", "useful_tokens_per_s_per_gpu",
               "padded_tokens_per_s_per_gpu", "nonpad_fraction", "mfu", "tflops_per_s_per_gpu", "step_s",
               "predicted_step_s", "predicted_useful_tokens_per_s_per_gpu", "predicted_mfu", "peak_mem_gib",
               "memory_gib", "headroom_gib", *TIME_KEYS, *FLOP_KEYS, "first_loss", "last_loss", "val_loss",
               "skipped_samples", "overrides", "path"]


def csv_row(job: Job, base: dict[str, str]) -> dict[str, Any]:
    lay = job.layout
    return {"section": job.section if job.status == "ok" else "not ranked", "rank": job.rank, "job": job.name,
            "num": job.num, "source": job.source, "status": job.status, "reason": job.reason,
            "description": describe(job, base), **{g: job.choices.get(g) for g in CHOSEN},
            "layout": layout_text(job) if job.config else None, "gpus": lay.get("gpus"), "tp": lay.get("tp"),
            "pp": lay.get("pp"), "ep": lay.get("ep"), "mbs": job.mbs, "frozen_vision": job.frozen,
            "mock_data": job.mock, **{k: job.metrics.get(k) for k in CSV_COLUMNS if k in job.metrics},
            **predicted_cells(job), "memory_gib": job.memory_gib, "headroom_gib": job.headroom_gib,
            "overrides": " ".join(job.overrides),
            "path": str(job.path) if job.path else None}


def predicted_cells(job: Job) -> dict[str, float | None]:
    """The CSV's predicted_* columns: check.speed's step, useful tokens/s/GPU and MFU from the run's speed.json."""
    t = job.predicted
    return {"predicted_step_s": t.step_s if t else None,
            "predicted_useful_tokens_per_s_per_gpu": t.useful_tokens_per_s_per_gpu if t else None,
            "predicted_mfu": t.mfu if t else None}


def _predicted(job: Job) -> str:
    """`predicted s (error %)` beside the measured step; blank without a speed.json."""
    err = job.predicted_error()
    return "" if job.predicted is None or err is None else f"{job.predicted.step_s:.3f} ({err:+.0%})"


def write_csv(jobs: list[Job], path: Path) -> None:
    base = baseline(jobs)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for job in jobs:
            writer.writerow(csv_row(job, base))


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(_md(c) for c in row) + " |" for row in rows)]


def _percent(x: float | None) -> str:
    return "" if x is None else f"{x:.0%}"


def _headroom(job: Job) -> str:
    h = job.headroom_gib
    return "" if h is None else f"{h:.1f} ({h / job.memory_gib:.0%})"


def ranked_table(jobs: list[Job], base: dict[str, str], kind: str) -> list[str]:
    header = ["rank", "job", "config", "GPUs", "MBS", "useful tok/s/GPU", "non-pad", "MFU", "TFLOP/s/GPU", "step (s)",
              "predicted step (s)", "peak mem (GiB)", "headroom (GiB)",
              "vision / projector / decoder" + (" time" if kind == "time" else " FLOPs"), "flags"]
    rows = [[j.rank, j.label, describe(j, base), j.layout.get("gpus", ""), j.mbs or "",
             f"{j.metrics['useful_tokens_per_s_per_gpu']:,.0f}", _percent(j.metrics.get("nonpad_fraction")),
             f"{j.metrics.get('mfu', 0.0):.3%}",
             f"{j.metrics.get('tflops_per_s_per_gpu', 0.0):.2f}", f"{j.metrics['step_s']:.3f}", _predicted(j),
             f"{j.metrics['peak_mem_gib']:.1f}", _headroom(j), split_text(j, kind), flags(j)] for j in jobs]
    return _table(header, rows)


def failure_table(jobs: list[Job], base: dict[str, str]) -> list[str]:
    """Why each job is not ranked; steps and throughput show how far it got before failing."""
    rows = [[j.label, STATUS[j.status], j.reason, describe(j, base), j.layout.get("gpus", ""), j.mbs or "",
             j.metrics.get("steps", "" if j.source.startswith("preflight") else 0),
             f"{j.metrics['useful_tokens_per_s_per_gpu']:,.0f}" if j.metrics else "",
             flags(j)] for j in jobs]
    return _table(["job", "status", "reason", "config", "GPUs", "MBS", "steps", "useful tok/s/GPU", "flags"], rows)


def validation_table(jobs: list[Job], base: dict[str, str]) -> list[str]:
    """Jobs that evaluated held-out samples (train.eval_interval): their validation loss, first and last."""
    rows = [[j.label, STATUS[j.status], describe(j, base), len(j.validation), j.validation[0][0],
             f"{j.validation[0][1]:.4f}", j.validation[-1][0], f"{j.validation[-1][1]:.4f}",
             f"{j.metrics['last_loss']:.4f}" if "last_loss" in j.metrics else ""] for j in jobs if j.validation]
    return _table(["job", "status", "config", "evaluations", "first at step", "first val loss", "last at step",
                   "last val loss", "last train loss"], rows)


def ranked_groups(jobs: list[Job]) -> list[tuple[str, list[Job]]]:
    """The ranked jobs by ranking group (section, then precision), each with its title, in report order."""
    out = []
    for group in sorted({j.ranking for j in jobs if j.rank is not None}):
        members = [j for j in jobs if j.rank is not None and j.ranking == group]
        title = SECTIONS[members[0].section] + (f" — precision {group[2]} (ranked only against {group[2]})"
                                                if group[2] != "bf16" else "")
        out.append((title, members))
    return out


def _sweep_line(root: Path | None) -> str | None:
    path = root / "multirun.yaml" if root else None
    if not path or not path.exists():
        return None
    task = ((load_yaml(path) or {}).get("hydra") or {}).get("overrides", {}).get("task") or []
    return "Sweep overrides: `" + " ".join(task) + "`" if task else None


def render(jobs: list[Job], source: str, root: Path | None) -> str:
    """The markdown report."""
    base, kind = baseline(jobs), split_kind(jobs)
    counts = Counter(STATUS[j.status] for j in jobs)
    # a job without a config (skipped by preflight) counts by its overrides: one that sets the knob otherwise differs
    fixed = {k: v for k, v in base.items() if all(j.knob(k) == v if j.config else j.knob(k) in (None, v)
                                                  for j in jobs)}
    lines = [f"# Sweep report: {Path(source).name or source}", "",
             f"Source: `{source}` · {len(jobs)} job{'s' * (len(jobs) != 1)}: "
             + ", ".join(f"{n} {s}" for s, n in counts.most_common()), "",
             f"Ranked by useful (non-padding) tokens/s/GPU over the steps after the first {SKIP} (warm-up): "
             "predicted step is check.speed's prediction the run was launched with (its speed.json) and its error; "
             "rates are total work / total time, step and component times medians; non-pad = the share of the "
             "tokens the model ran that are not padding. MFU uses vlmtrain's model FLOPs and the hardware group's "
             "dense BF16 peak, for every precision (FP8 runs are ranked in their own sections and also record "
             "mfu_precision_peak, against the format's own peak); peak memory is the max allocated over ranks; "
             "headroom is the hardware group's "
             "memory_gib minus that peak."]
    lines += [x for x in (_sweep_line(root),) if x]
    if fixed:
        lines += ["", "Same in every job: " + ", ".join(f"{k}={v}" for k, v in fixed.items()) + "."]
    varying = {k: v for k, v in base.items() if k not in fixed and not shown_elsewhere(k)}
    if varying:
        lines += ["Baseline of the `config` column (each row lists its model, layout and only what differs): "
                  + ", ".join(f"{k}={v}" for k, v in varying.items()) + "."]
    if kind == "flops":
        lines += ["", "No per-component times in metrics.jsonl: the split columns show the model **FLOP** split, "
                  "not time."]
    for title, members in ranked_groups(jobs):
        lines += ["", f"## {title}", "", *ranked_table(members, base, kind)]
    others = [j for j in jobs if j.rank is None]
    if others:
        lines += ["", "## Not ranked: failures, skips and unfinished runs", "", *failure_table(others, base)]
    validated = any(j.validation for j in jobs)
    if validated:
        lines += ["", "## Validation loss", "", "The held-out samples' loss (`val_lm_loss` in metrics.jsonl: Bridge's "
                  "evaluation every train.eval_interval steps and after the last one; step numbers as in "
                  "metrics.jsonl).", "", *validation_table(jobs, base)]
    plots = {**PLOTS, **({"validation": VALIDATION_PLOT} if validated else {})}
    lines += ["", "## Plots", "", *(f"![{k}]({name})" for k, name in plots.items()), ""]
    return "\n".join(lines)
