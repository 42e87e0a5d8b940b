"""Validation on one GPU through train.py (Bridge's own evaluation in its loop): run with `pytest -m gpu`.

Half of the 16 sample photos held out (one evaluation batch of 8 at train.global_batch_size=8), evaluated every 4
of 10 steps and after the last: the rows of steps 3, 7 and 9 (metrics.jsonl numbering) carry a finite val_lm_loss,
and every step counts only its own batches (the evaluation's are dropped from the counters). Packed, the held-out
samples are served as their own bins.
"""

from __future__ import annotations

import math

import pytest

from vlmtrain.config.world import local_gpus
from vlmtrain.lab.kit import runner
from vlmtrain.lab.kit.baselines import TINY, steps
from vlmtrain.lab.kit.case import Case
from vlmtrain.observe import run_summary

pytestmark = pytest.mark.gpu

HELD_OUT = ["data.validation_fraction=0.5", "train.eval_interval=4", "train.eval_iters=2"]
CASES = [
    Case("tiny_validation_1gpu", 1, [*TINY, *steps(10), *HELD_OUT], dry_run=False),
    # the 8 held-out photos make 5 rows of <= 1024 tokens (the data stage's bins, on CPU): batches of 4 rows
    Case("tiny_validation_packed_1gpu", 1, [*TINY, *steps(10, 4), *HELD_OUT, "data.packing=1024"], dry_run=False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_validation_loss_on_the_evaluated_steps(case, tmp_path):
    if local_gpus() < case.gpus:
        pytest.skip(f"needs {case.gpus} GPU(s)")
    run = runner.start(case, tmp_path, fresh=True)
    assert run.wait() == 0, run.log.read_text()[-6000:]
    rows = run_summary.read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(10))
    evaluated = {r["step"]: r["val_lm_loss"] for r in rows if "val_lm_loss" in r}
    assert sorted(evaluated) == [3, 7, 9] and all(math.isfinite(v) for v in evaluated.values())
    if "packed" not in case.name:  # padded: every step reads exactly its 8 training samples
        assert {r["samples"] for r in rows} == {8}
    assert "validation loss at iteration 4" in run.log.read_text()
