"""The results store: one JSON row per measured run appended to results/<topic>.jsonl, and the rule that picks a
name's current row.

A row is {name, command, date, machine, lease, metrics, ...}; metric keys carry units (the run's own figures come
from vlmtrain.observe.run_summary). Medians of repeats on one machine are vlmtrain.lab.repeats'.
"""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path
from typing import Any

from vlmtrain.observe.run_summary import append_jsonl, read_jsonl

__all__ = ["append", "append_jsonl", "latest", "lease", "machine", "read_jsonl"]


def latest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per name, in first-seen order: a later row of a name replaces an earlier one (a re-run, or a row
    re-summarized from the same run's files); rows marked `superseded` (their command no longer means what it
    measured) are left out."""
    by_name = {r["name"]: r for r in rows if "superseded" not in r}
    return [by_name[n] for n in dict.fromkeys(r["name"] for r in rows) if n in by_name]


def lease() -> str:
    """This machine's boot id: a lent GPU machine is booted fresh, so runs with the same id share a lease."""
    try:
        return "lease-" + Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return "lease-unknown"


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
        "lease": lease(),  # ratios and medians compare only runs of one lease
        "metrics": metrics,
        **extra,
    }
    results.parent.mkdir(parents=True, exist_ok=True)
    append_jsonl(results, row)
    return row
