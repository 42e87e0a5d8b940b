"""The acceptance suite's judgement, replayed on CPU over the run dirs it recorded on the H200.

Every case's recorded run passes its own verdict; a run recorded before the dispatcher check was fixed (empty
`dispatcher_classes`), a run whose loss did not fall, and a sweep without its report each fail it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vlmtrain.lab.checks import acceptance
from vlmtrain.lab.checks.acceptance import Expected
from vlmtrain.lab.kit.runner import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
RECORDED = FIXTURES / "gpu_acceptance"
CASES = {c.name: c for c in acceptance.CASES}


def _outcome(case: Expected, run_dir: Path) -> dict:
    """The outcome at the exit status the suite recorded for this case (its row, kept as the run dir's case.json)."""
    return acceptance.outcome(case, acceptance.recorded_rc(RECORDED / case.name), run_dir, 0.0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_run_passes_its_verdict(name: str) -> None:
    case = CASES[name]
    assert acceptance.verdict(case, _outcome(case, RECORDED / name)) == []


def test_the_jit_cache_made_the_second_qwen35_run_start_fast() -> None:
    first, second = (_outcome(CASES[n], RECORDED / n)["metrics"]["first_step_s"]
                     for n in ("qwen35-l4_first-run", "qwen35-l4_second-run"))
    assert second < 60.0 < first


def test_vacuous_dispatcher_check_fails_the_verdict() -> None:
    old = FIXTURES / "gpu_cases" / "tiny_3d_ep2_trainable_recompute-none_graph-none_2gpu"
    problems = acceptance.verdict(CASES["tiny_sample"], _outcome(CASES["tiny_sample"], old))
    assert problems == ["dispatcher_classes []"]


def test_a_loss_that_did_not_fall_and_a_missing_report_fail(tmp_path: Path) -> None:
    run = shutil.copytree(RECORDED / "tiny_sample", tmp_path / "run")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[-1]["lm_loss"] = rows[0]["lm_loss"] + 1.0
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert any("loss did not fall" in p for p in acceptance.verdict(CASES["tiny_sample"],
                                                                     _outcome(CASES["tiny_sample"], run)))
    sweep = shutil.copytree(RECORDED / "tiny_sweep_mbs", tmp_path / "sweep")
    (sweep / "report.md").unlink()
    assert any("report" in p for p in acceptance.verdict(CASES["tiny_sweep_mbs"],
                                                          _outcome(CASES["tiny_sweep_mbs"], sweep)))
