"""A run's own figures: its metrics.jsonl (one row per step) read and summarized, the headline and the per-component
figures every later stage reports (the report's jobs, the W&B run summary, the lab's results rows). Metric keys carry
units. Only the steps after warm-up count (the first `skip` steps include compilation, CUDA-graph capture and allocator
growth). Rates (tokens/s, TFLOP/s, MFU) are over the whole steady window: total work / total time, i.e. per-step rates
weighted by step time. A median of per-step rates would overstate them whenever steps carry unequal work (packed real
images: steps with more tokens run at higher rates; up to ~10 % in results/perf_h200x2.jsonl). Step time and the other
keys are medians. Per tower (vit, projector, decoder), `mfu_<tower>` is the tower's FLOPs over its own timed span
(observe.timing's per-component seconds) against the same peak as `mfu`. The first row's startup spans (observe.startup)
are copied as they are.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from vlmtrain.observe.keys import tower_mfu_key
from vlmtrain.observe.startup import KEYS as STARTUP_KEYS

SKIP = 3
"""Warm-up steps left out of every summary."""
HEADLINE_KEYS = ("step_s", "useful_tokens_per_s_per_gpu", "padded_tokens_per_s_per_gpu", "tflops_per_s_per_gpu", "mfu",
                 "mfu_precision_peak")
RATE_KEYS = frozenset(HEADLINE_KEYS[1:])
"""Per-step rates: summarized as total work / total time (weighted by step_s), not as a median."""
TIME_KEYS = ("time_vision_s", "time_projector_s", "time_decoder_s", "time_optimizer_s", "time_data_s", "time_other_s")
"""observe.timing's per-component seconds of a step (rank 0); `other` = step_s minus the named ones."""
FLOP_KEYS = ("flops_vit", "flops_projector", "flops_decoder")
SUMMARY_KEYS = (*HEADLINE_KEYS, *TIME_KEYS, *FLOP_KEYS, "vlmtrain_host_s", "skipped_samples", "truncated_samples")
"""A run's summary: the headline, the per-component seconds, the FLOPs split, vlmtrain's own host time and the data
scan's counts (truncated samples only where data.truncate_long_samples counts them)."""
TOWERS = {"vit": "time_vision_s", "projector": "time_projector_s", "decoder": "time_decoder_s"}
"""Each tower's FLOPs key suffix (flops_<tower>) -> its timed span in a metrics row."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    """One JSON row at the end of `path` (a run's metrics.jsonl and samples.jsonl)."""
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def steady(rows: list[dict[str, Any]], skip: int = SKIP) -> list[dict[str, Any]]:
    """The rows after warm-up; the last row when a run is shorter than its warm-up."""
    return rows[skip:] or rows[-1:]


def summarize_rows(rows: list[dict[str, Any]], skip: int = SKIP,
                   keys: tuple[str, ...] = HEADLINE_KEYS) -> dict[str, Any]:
    """Headline metrics of one run's step rows (metrics.jsonl or W&B history) after warm-up: RATE_KEYS weighted by
    step time, other `keys` medians; a key no steady row has a number for is left out (W&B history may lack some)."""
    if not rows:
        return {}
    after = steady(rows, skip)
    summary = {}
    for key in keys:
        have = [r for r in after if isinstance(r.get(key), int | float)]
        if key in RATE_KEYS and have and all(isinstance(r.get("step_s"), int | float) for r in have):
            summary[key] = sum(r[key] * r["step_s"] for r in have) / sum(r["step_s"] for r in have)
        elif have:
            summary[key] = statistics.median(r[key] for r in have)
    step = {"step_s": summary.pop("step_s")} if "step_s" in summary else {}  # the results files' key order
    out = {"steps": len(rows), **step, "peak_mem_gib": max(r.get("peak_mem_gib", 0.0) for r in rows), **summary}
    padded = sum(r.get("padded_tokens", 0) for r in after)
    if padded:
        out["nonpad_fraction"] = sum(r.get("nonpad_tokens", 0) for r in after) / padded
    out.update({k: rows[0][k] for k in STARTUP_KEYS if isinstance(rows[0].get(k), int | float)})
    losses = [r["lm_loss"] for r in rows if isinstance(r.get("lm_loss"), int | float)]
    if losses:
        out.update(first_loss=losses[0], last_loss=losses[-1])
    return out | tower_mfu(after)


def tower_mfu(rows: list[dict[str, Any]]) -> dict[str, float]:
    """mfu_<tower> over these rows: the tower's total FLOPs / its total timed seconds / (GPUs x peak), where
    GPUs x peak is read back from each row's own mfu (mfu = flops / (step_s x GPUs x peak)); towers without FLOPs and
    time in every row, or that never ran, are left out."""
    have = [r for r in rows if all(isinstance(r.get(k), int | float) and r[k] > 0 for k in ("flops", "step_s", "mfu"))]
    if not have:
        return {}
    peak = [r["flops"] / (r["step_s"] * r["mfu"]) for r in have]  # FLOP/s of the whole world at 100 % MFU
    out = {}
    for tower, span in TOWERS.items():
        pairs = [(r.get(f"flops_{tower}"), r.get(span), p) for r, p in zip(have, peak, strict=True)]
        if all(isinstance(f, int | float) and isinstance(t, int | float) for f, t, _ in pairs):
            seconds = sum(t for _, t, _ in pairs)
            if seconds > 0:
                out[tower_mfu_key(tower)] = sum(f / p for f, _, p in pairs) / seconds
    return out


def summarize(run_dir: Path, skip: int = SKIP, keys: tuple[str, ...] = HEADLINE_KEYS) -> dict[str, Any]:
    """Headline metrics (summarize_rows) of one run from its metrics.jsonl."""
    return summarize_rows(read_jsonl(Path(run_dir) / "metrics.jsonl"), skip, keys)
