"""The GPU acceptance suite (vlmtrain.lab.checks.acceptance) as tests: `pytest -m gpu tests/gpu/test_acceptance.py`.

All cases run once (side-by-side ones together, large models alone), then each case is asserted on what its run
recorded. Rows go to $VLMTRAIN_ACCEPTANCE_RESULTS (default results/gpu_acceptance.jsonl).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vlmtrain.config.world import local_gpus
from vlmtrain.lab.checks import acceptance
from vlmtrain.lab.kit import runner

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def problems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    if local_gpus() < 1:
        pytest.skip("needs a GPU")
    out = tmp_path_factory.mktemp("acceptance")
    results_path = Path(os.environ.get("VLMTRAIN_ACCEPTANCE_RESULTS", runner.ROOT / "results/gpu_acceptance.jsonl"))
    return acceptance.run_cases(acceptance.CASES, out, results_path, out / "inputs",
                          os.environ.get("VLMTRAIN_COMMIT", "unknown"))


@pytest.mark.parametrize("name", [c.name for c in acceptance.CASES])
def test_case(problems: dict[str, list[str]], name: str) -> None:
    assert problems[name] == []
