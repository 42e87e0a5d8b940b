"""The reliability checks on one GPU (vlmtrain.lab.checks.reliability): no planted secret in a real run's files
or checkpoint dir, a NaN loss stops the run with its record (or is skipped and counted), a CUDA OOM names its
component and the estimate's overrides, a kill -9 mid-checkpoint leaves the previous checkpoint the one loaded and
resumed (kill_ckpt_*: `pytest -m gpu tests/gpu/test_reliability.py -k kill_ckpt`). `pytest -m gpu
tests/gpu/test_reliability.py`; the same checks with rows in results/reliability.jsonl:
`vlmtrain lab reliability`."""

from __future__ import annotations

import pytest

from vlmtrain.config.world import local_gpus
from vlmtrain.lab.checks.reliability import CHECKS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", list(CHECKS))
def test_check(name, tmp_path):
    if local_gpus() < 1:
        pytest.skip("needs a GPU")
    passed, metrics, cmd = CHECKS[name](tmp_path)
    assert passed, f"{cmd}: {metrics}"
