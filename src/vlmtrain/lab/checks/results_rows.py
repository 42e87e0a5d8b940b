"""Every measured row in the results files carries what a quoted figure needs to be traced (name, command, ISO date,
machine, metrics as an object), so a row appended by hand or by a GPU run cut short that lost a field is caught
before anyone quotes it. CI runs it before the tests:

    vlmtrain lab results-rows [DIR ...]  # default results/; exit 1 naming each bad row
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from vlmtrain.lab.kit.runner import ROOT

REQUIRED = ("name", "command", "date", "machine", "metrics")


def problem(row: Any) -> str | None:
    """What is wrong with one parsed row of a results file, or None."""
    if not isinstance(row, dict):
        return "not an object"
    missing = [k for k in REQUIRED if not row.get(k)]
    if missing:
        return f"missing {', '.join(missing)}"
    if not isinstance(row["metrics"], dict):
        return "metrics is not an object"
    try:
        dt.date.fromisoformat(row["date"])
    except (TypeError, ValueError):
        return f"date {row['date']!r} is not YYYY-MM-DD"
    return None


def check(folder: Path) -> tuple[int, list[str]]:
    """The number of rows in the folder's *.jsonl files and `<file>:<line> <name>: <problem>` for each bad one."""
    rows, bad = 0, []
    for path in sorted(folder.glob("*.jsonl")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            rows += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                bad.append(f"{path.name}:{i}: not JSON ({e.msg})")
                continue
            if found := problem(row):
                bad.append(f"{path.name}:{i} {row.get('name') if isinstance(row, dict) else None}: {found}")
    return rows, bad


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("folders", nargs="*", type=Path, default=[ROOT / "results"])


def run(args: argparse.Namespace) -> int:
    rows, bad = 0, []
    for folder in args.folders:
        n, found = check(folder)
        rows, bad = rows + n, bad + [f"{folder}/{line}" for line in found]
    for line in bad:
        print(line)
    print(f"results_rows: {len(bad)} bad of {rows} rows in {', '.join(map(str, args.folders))}")
    return 1 if bad or not rows else 0  # no rows at all: a wrong folder, not a clean one
