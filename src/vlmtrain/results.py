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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(run_dir: Path, skip: int = 3) -> dict[str, Any]:
    """Headline metrics of one run from its metrics.jsonl."""
    rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    if not rows:
        return {}
    steady = rows[skip:] or rows[-1:]
    losses = [r["lm_loss"] for r in rows if "lm_loss" in r]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in steady)

    out = {
        "steps": len(rows),
        "step_s": med("step_s"),
        "peak_mem_gib": max(r["peak_mem_gib"] for r in rows),
        "useful_tokens_per_s_per_gpu": med("useful_tokens_per_s_per_gpu"),
        "padded_tokens_per_s_per_gpu": med("padded_tokens_per_s_per_gpu"),
        "tflops_per_s_per_gpu": med("tflops_per_s_per_gpu"),
        "mfu": med("mfu"),
        "nonpad_fraction": sum(r["nonpad_tokens"] for r in steady) / max(sum(r["padded_tokens"] for r in steady), 1),
    }
    if losses:
        out.update(first_loss=losses[0], last_loss=losses[-1])
    return out


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
    with results.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row
