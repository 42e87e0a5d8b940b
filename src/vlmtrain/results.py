"""Results files: summarize a run directory and append one JSON row per measured run to results/<topic>.jsonl.

A row is {name, command, date, machine, metrics, config}; metric keys carry units. Step time is the median
of the steps after warm-up (the first `skip` steps include compilation, CUDA-graph capture and allocator
growth).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

SKIP = 3
"""Warm-up steps left out of every median."""
HEADLINE_KEYS = ("step_s", "useful_tokens_per_s_per_gpu", "padded_tokens_per_s_per_gpu", "tflops_per_s_per_gpu", "mfu")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steady(rows: list[dict[str, Any]], skip: int = SKIP) -> list[dict[str, Any]]:
    """The rows after warm-up; the last row when a run is shorter than its warm-up."""
    return rows[skip:] or rows[-1:]


def summarize_rows(rows: list[dict[str, Any]], skip: int = SKIP,
                   keys: tuple[str, ...] = HEADLINE_KEYS) -> dict[str, Any]:
    """Headline metrics of one run's step rows (metrics.jsonl or W&B history): medians of `keys` after warm-up;
    a key no steady row has a number for is left out (W&B history may lack some)."""
    if not rows:
        return {}
    after = steady(rows, skip)
    medians = {}
    for key in keys:
        values = [r[key] for r in after if isinstance(r.get(key), int | float)]
        if values:
            medians[key] = statistics.median(values)
    step = {"step_s": medians.pop("step_s")} if "step_s" in medians else {}  # the results files' key order
    out = {"steps": len(rows), **step, "peak_mem_gib": max(r.get("peak_mem_gib", 0.0) for r in rows), **medians}
    padded = sum(r.get("padded_tokens", 0) for r in after)
    if padded:
        out["nonpad_fraction"] = sum(r.get("nonpad_tokens", 0) for r in after) / padded
    losses = [r["lm_loss"] for r in rows if isinstance(r.get("lm_loss"), int | float)]
    if losses:
        out.update(first_loss=losses[0], last_loss=losses[-1])
    return out


def summarize(run_dir: Path, skip: int = SKIP, keys: tuple[str, ...] = HEADLINE_KEYS) -> dict[str, Any]:
    """Headline metrics (medians of `keys`) of one run from its metrics.jsonl."""
    return summarize_rows(read_jsonl(Path(run_dir) / "metrics.jsonl"), skip, keys)


def machine() -> str:
    try:
        names = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=True
        ).stdout.split("\n")
        names = [n.strip() for n in names if n.strip()]
        return f"{len(names)}x {names[0]}" if names else "cpu"
    except (OSError, subprocess.CalledProcessError):
        return "cpu"


def append(results: Path, name: str, command: str, metrics: dict[str, Any], **extra: Any) -> dict[str, Any]:
    row = {
        "name": name,
        "command": command,
        "date": dt.date.today().isoformat(),
        "machine": machine(),
        "metrics": metrics,
        **extra,
    }
    results.parent.mkdir(parents=True, exist_ok=True)
    append_jsonl(results, row)
    return row


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
