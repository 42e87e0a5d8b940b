"""The results store: every row the lab writes, one JSON row per measured run appended to results/<topic>.jsonl,
and the rule that picks a name's current row.

A row is {name, command, date, machine, machine_run, metrics, ...}; metric keys carry units (the run's own figures
come from vlmtrain.observe.run_summary). Medians of repeats on one machine run are vlmtrain.lab.kit.schedule'.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

from vlmtrain.observe.run_summary import append_jsonl

IDENTITY = ("date", "machine", "machine_run")
"""What a row says about where and when it was measured: this machine today, unless the row is derived from rows
or runs of another machine or day and keeps theirs."""


def latest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per name, in first-seen order: a later row of a name replaces an earlier one (a re-run, or a row
    re-summarized from the same run's files); rows marked `superseded` (their command no longer means what it
    measured) are left out."""
    by_name = {r["name"]: r for r in rows if "superseded" not in r}
    return [by_name[n] for n in dict.fromkeys(r["name"] for r in rows) if n in by_name]


def machine_run() -> str:
    """`boot-<first 8 hex of the kernel's boot id>`: a GPU machine boots fresh for each session, so runs with the
    same boot id ran on one machine (one machine run). Machines of one kind differ by more than the effects measured,
    so medians and ratios compare only runs of one machine run."""
    try:
        return "boot-" + Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return "boot-unknown"


def machine() -> str:
    try:
        names = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=True
        ).stdout.split("\n")
        names = [n.strip() for n in names if n.strip()]
        return f"{len(names)}x {names[0]}" if names else "cpu"
    except (OSError, subprocess.CalledProcessError):
        return "cpu"


def row(name: str, command: Any, metrics: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A results row: name, command, the IDENTITY fields (today and this machine's, where `extra` does not give
    them), metrics, then `extra`."""
    today = {"date": lambda: dt.date.today().isoformat(), "machine": machine, "machine_run": machine_run}
    ident = {k: extra.pop(k) if k in extra else today[k]() for k in IDENTITY}
    return {"name": name, "command": command, **ident, "metrics": metrics, **extra}


def append(results: Path, name: str, command: Any, metrics: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """`row(...)` appended to the results file; returns it."""
    out = row(name, command, metrics, **extra)
    results.parent.mkdir(parents=True, exist_ok=True)
    append_jsonl(results, out)
    return out


def rewrite(results: Path, rows: list[dict[str, Any]]) -> None:
    """A results file that is derived whole from other rows (the memory estimates of the measured peaks): written
    again from `rows`, each made by `row`."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
