"""`vlmtrain lab gdn-varlen`: packed against alone, judged against the BF16 rounding floor. Its GPU kernels (FLA's)
need CUDA; here the same harness runs two real torch computations on CPU: one that treats every token alone
(packing cannot change it) and Megatron's deterministic-mode conv (torch's conv1d, which takes no `cu_seqlens`
and so reads across the packed row's boundaries)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from vlmtrain.lab.micro import gdn_varlen

SHAPES = {"key_heads": 1, "value_heads": 2, "key_head_dim": 8, "value_head_dim": 8, "conv_width": 4}
LENGTHS = [37, 5, 64]


def per_token(t: dict[str, Any], s: dict[str, int], cu: Any) -> tuple[Any, dict[str, Any]]:
    y = F.silu(t["x"]) * t["conv_weight"][:, 0]
    return (y * t["grad_conv"]).sum(), {"y": y}


def torch_conv(t: dict[str, Any], s: dict[str, int], cu: Any) -> tuple[Any, dict[str, Any]]:
    """GatedDeltaNet's deterministic-mode conv (gdn.py): torch's depthwise conv1d, causal by its padding."""
    x = t["x"].transpose(1, 2)
    w = t["conv_weight"][:, None, :]
    y = F.silu(F.conv1d(x, w, padding=s["conv_width"] - 1, groups=x.shape[1])[..., : x.shape[-1]]).transpose(1, 2)
    return (y * t["grad_conv"]).sum(), {"y": y}


def test_a_per_token_computation_is_the_same_packed() -> None:
    m = gdn_varlen.measure(per_token, ("x", "conv_weight"), SHAPES, LENGTHS, device="cpu")
    assert m["changed"] == []
    assert m["packed_vs_alone"]["y"]["rel_err"] == 0.0 and m["packed_vs_alone"]["d_x"]["rel_err"] == 0.0
    assert 0 < m["rounding_floor"]["d_conv_weight"]["rel_err"] < 0.02  # BF16 against FP32: a real floor


def test_a_conv_that_reads_across_boundaries_is_caught() -> None:
    m = gdn_varlen.measure(torch_conv, ("x", "conv_weight"), SHAPES, LENGTHS, device="cpu")
    assert set(m["changed"]) == {"y", "d_x", "d_conv_weight"}
    # only the first conv_width - 1 tokens of each later segment read across: far past rounding, not unrelated
    assert m["packed_vs_alone"]["y"]["rel_err"] > gdn_varlen.FLOOR_MARGIN * m["rounding_floor"]["y"]["rel_err"]
    assert m["packed_vs_alone"]["y"]["cosine"] > 0.5


def test_the_shapes_are_the_models(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert gdn_varlen.shapes("qwen35_vl_35b_a3b") == {"key_heads": 16, "value_heads": 32, "key_head_dim": 128,
                                                     "value_head_dim": 128, "conv_width": 4}
    a = argparse.Namespace(model="tiny_qwen35", lengths=[8, 8], only=list(gdn_varlen.CHECKS),
                           results=tmp_path / "r.jsonl", list=True)
    assert gdn_varlen.run(a) == 0
    assert "'value_heads': 4" in capsys.readouterr().out
    if not torch.cuda.is_available():
        a.list = False
        assert gdn_varlen.run(a) == 2 and not a.results.exists()
