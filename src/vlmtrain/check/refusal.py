"""A run refused before any rank starts (a value the schema refuses, preflight, the data scan, Bridge's validation
in a dry run, too few GPUs) says why once, on stderr and in `<run dir>/failure-refused.json`, so a sweep's last
lines and its report name the reason (Hydra's job log captures neither stdout nor stderr) instead of
"incomplete"."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REFUSED = "failure-refused.json"
STATUS = 2
"""The exit status of a refused run (train.py; a -m sweep's job); 3 where Bridge's validation refused a dry run."""


def refuse(output_dir: str | Path, message: str, printed: bool = False, status: int = STATUS) -> int:
    """The one message on stderr (`printed`: already said, e.g. in the plan) and in the run dir's record; returns
    `status`."""
    if not printed:
        print(f"[vlmtrain] {message}", file=sys.stderr, flush=True)
    path = Path(output_dir) / REFUSED
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": "refused", "status": status, "error": message}, indent=1) + "\n")
    return status


def refusal(run_dir: str | Path) -> dict[str, Any] | None:
    """The record `refuse` wrote in `run_dir`; None where there is none."""
    path = Path(run_dir) / REFUSED
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None
