"""Every measured row in results/*.jsonl carries what the project's standard asks of it (name, command, date,
machine, metrics as an object), so a row appended by hand or by a device call that lost a field fails here."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "results").glob("*.jsonl"))


def test_every_results_row_names_its_run_command_date_machine_and_metrics() -> None:
    assert len(FILES) >= 10  # the shipped results files, not an empty glob
    problems = []
    for path in FILES:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            row = json.loads(line)
            missing = [k for k in ("name", "command", "date", "machine", "metrics") if not row.get(k)]
            if missing or not isinstance(row["metrics"], dict):
                problems.append(f"{path.name}:{i} {row.get('name')}: missing {missing or 'metrics object'}")
                continue
            dt.date.fromisoformat(row["date"])
    assert not problems, "\n".join(problems)
