"""vlmtrain.lab.checks.results_rows on recorded rows (tests/fixtures): a folder of good rows passes, and each kind of
bad row planted among them is named by file, line and run name, with exit status 1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vlmtrain import cli
from vlmtrain.lab.checks import results_rows

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
GOOD = [FIXTURES / "logits_memory_h200" / "rows.jsonl", FIXTURES / "perf_h200" / "rows.jsonl"]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The recorded rows as a results folder: one file per topic."""
    for path in GOOD:
        shutil.copy(path, tmp_path / f"{path.parent.name}.jsonl")
    return tmp_path


def test_recorded_rows_pass(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert results_rows.check(folder) == (58, [])
    assert cli.main(["lab", "results-rows", str(folder)]) == 0
    assert "0 bad of 58 rows" in capsys.readouterr().out


def test_each_planted_bad_row_is_named(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = json.loads((folder / "logits_memory_h200.jsonl").read_text().splitlines()[0])
    planted = [{k: v for k, v in good.items() if k != "command"}, {**good, "metrics": 4.0},
               {**good, "date": "Dec 3"}, {**good, "machine": ""}]
    with (folder / "logits_memory_h200.jsonl").open("a") as f:
        f.writelines(json.dumps(row) + "\n" for row in planted)
        f.write('{"name": "cut off\n')
    rows, bad = results_rows.check(folder)
    name = good["name"]
    assert rows == 63 and bad == [f"logits_memory_h200.jsonl:3 {name}: missing command",
                                  f"logits_memory_h200.jsonl:4 {name}: metrics is not an object",
                                  f"logits_memory_h200.jsonl:5 {name}: date 'Dec 3' is not YYYY-MM-DD",
                                  f"logits_memory_h200.jsonl:6 {name}: missing machine",
                                  "logits_memory_h200.jsonl:7: not JSON (Unterminated string starting at)"]
    assert cli.main(["lab", "results-rows", str(folder)]) == 1
    assert f"{folder}/logits_memory_h200.jsonl:3 {name}: missing command" in capsys.readouterr().out


def test_a_folder_without_rows_fails(tmp_path: Path) -> None:
    """A wrong path is not a clean results folder."""
    assert cli.main(["lab", "results-rows", str(tmp_path)]) == 1
