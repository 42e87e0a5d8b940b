"""`vlmtrain lab gdn-varlen` on a GPU with FLA's kernels: the tiny Qwen3.5 model's shapes, whose packed training is
proven equal to per-sample training (results/packing_equivalence.jsonl), so its kernels must agree packed and alone;
each check writes its row. Run with `pytest -m gpu`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from vlmtrain.lab.micro import gdn_varlen

pytestmark = pytest.mark.gpu


def test_tiny_qwen35_kernels_agree_packed(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    a = argparse.Namespace(model="tiny_qwen35", lengths=[300, 77, 130, 2], only=list(gdn_varlen.CHECKS),
                           results=tmp_path / "gdn.jsonl", list=False)
    assert gdn_varlen.run(a) == 0
    rows = [json.loads(line) for line in a.results.read_text().splitlines()]
    assert [r["name"] for r in rows] == [f"gdn-varlen_tiny_qwen35_{c}" for c in gdn_varlen.CHECKS]
    for r in rows:
        assert r["metrics"]["passed"] and r["metrics"]["changed"] == []
        assert all(0 <= m["rel_err"] < 1 for m in r["metrics"]["packed_vs_alone"].values())
