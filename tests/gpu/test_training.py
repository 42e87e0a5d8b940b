"""Real training through train.py on GPUs (Bridge's loop, TE, real images): run with `pytest -m gpu`.

Each case of the gpu_training suite (vlmtrain.lab.cases, which runs it too) trains a
few steps; the test asserts what the run itself recorded: the loss fell, and checks.json shows the requested
setting took effect.
"""

from __future__ import annotations

import json

import pytest

from vlmtrain.config.world import local_gpus
from vlmtrain.lab import cases as run_cases
from vlmtrain.lab.kit import runner
from vlmtrain.observe import run_summary

CASES = run_cases.SUITES["gpu_training"]

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_trains(case, tmp_path):
    if local_gpus() < case.gpus:
        pytest.skip(f"needs {case.gpus} GPU(s)")
    run = runner.start(case, tmp_path, fresh=True)
    assert run.wait() == 0, run.log.read_text()[-6000:]
    summary = run_summary.summarize(tmp_path)
    assert summary["last_loss"] < summary["first_loss"]
    checks = json.loads((tmp_path / "checks.json").read_text())
    params = checks["params"]
    assert checks["frozen_unchanged"]
    if "_frozen" in case.name:
        assert params["vision"]["trainable"] == 0 and params["vision"]["frozen"] > 0
        assert ("frozen-projector" in case.name) == (params["projector"]["trainable"] == 0)
    else:
        assert params["vision"]["trainable"] > 0 and params["vision"]["frozen"] == 0
    if "recompute-selective" in case.name:
        assert checks["recompute_granularity"] == "selective" and checks["recompute_modules"]
    elif "recompute-full" in case.name:
        assert checks["recompute_granularity"] == "full"
    else:
        assert checks["recompute_granularity"] is None and checks["recompute_modules"] == []
    if "graph-moe_router" in case.name:
        assert checks["graphed_layers"] > 0
    assert checks["dispatcher_classes"] == ["MoEAlltoAllTokenDispatcher"]
