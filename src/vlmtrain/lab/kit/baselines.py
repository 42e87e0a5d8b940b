"""What experiments build their cases from: the shared model baselines, a baseline's length, and the real-file
datasets cases read.

The lab's two one-GPU benchmarks, by the names its cases, rows and docstrings use (conf/tune/perf_h200.yaml runs them):
- H1: one H200 training Qwen3-VL-30B-A3B's layer shapes at 4 decoder layers (L4_30B) with the full 27-layer ViT,
  vision and decoder trainable, data=realistic, train.seq_length=4096, BF16 (its fastest configuration ships as
  experiment=perf_h200_best);
- H2: the same for Qwen3.5-VL-35B-A3B (L4_35).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vlmtrain.lab.kit.case import Case

TINY = ["model=tiny"]
L4_30B = ["model=qwen3_vl_30b_a3b", "model.num_layers=4"]
"""Qwen3-VL-30B-A3B's layer shapes at 4 decoder layers: the fewest that hold its 3 deepstack layers."""
SHAPE_30B = [*L4_30B, "data=realistic"]
L4_35 = ["model=qwen35_vl_35b_a3b", "model.num_layers=4"]
"""Qwen3.5-VL-35B-A3B's layer shapes at 4 decoder layers (benchmark H2's): one 3:1 block of Gated DeltaNet and
attention."""
SHAPE_35 = [*L4_35, "data=realistic"]
L2_35 = ["model=qwen35_vl_35b_a3b", "model.num_layers=2", "model.linear_attention.full_attention_interval=2"]
"""H2's layer shapes at 2 decoder layers, one Gated DeltaNet and one full attention: both mixers at the real shapes
in what one 80 GB H100 holds with the optimizer (H2's 4 layers do not)."""
TINY_QWEN35 = ["model=tiny_qwen35"]
# The largest 235B depth one H200 holds (memory estimate 92.5 GiB): one layer, so one deepstack merger.
SHAPE_235B = ["model=qwen3_vl_235b_a22b", "model.num_layers=1", "model.vit.deepstack_indexes=[8]", "data=realistic"]


def steps(iterations: int, global_batch_size: int = 8) -> list[str]:
    """A baseline's length: train.iterations and train.global_batch_size."""
    return [f"train.iterations={iterations}", f"train.global_batch_size={global_batch_size}"]


INPUTS = "{inputs}"
"""Placeholder in a case's overrides for the folder `export_inputs` writes the real-file datasets into."""
EXPORTS = {"jsonl": 0, "parquet": 0, "hf": 0, "energon": 0, "parquet_bad": 2}
"""Folder under INPUTS -> its corrupt images (the format is the folder name's first part)."""


def export_inputs(inputs: Path) -> None:
    """The shipped sample photos in each file format a case reads (what `vlmtrain data export` writes), each folder
    once."""
    from vlmtrain.data.export import export

    for folder, corrupt in EXPORTS.items():
        if not (inputs / folder).exists():
            export(folder.split("_")[0], inputs / folder, corrupt=corrupt)


def with_inputs(case: Case, inputs: Path | str) -> Case:
    """The case with INPUTS replaced by the folder (a recorded command names it `<inputs>`)."""
    return dataclasses.replace(case, overrides=[o.replace(INPUTS, str(inputs)) for o in case.overrides])
