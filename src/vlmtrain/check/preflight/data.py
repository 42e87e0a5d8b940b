"""Preflight rules: the data (images fit the sequence, paths exist) and what a run may be compared with."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vlmtrain.check.preflight.registry import Severity, rule
from vlmtrain.config.groups.data import Kind as DataKind

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


@rule(Severity.error)
def seq_fits_images(run: RunConfig, res: Resolved) -> str | None:
    d = run.data
    if d.kind == DataKind.realistic:
        worst = d.payload.image_tokens_max * (len(d.payload.images_per_sample) - 1)
        if worst >= run.train.seq_length:
            return (f"data=realistic can put {worst} image tokens in one sample, more than train.seq_length="
                    f"{run.train.seq_length}. Raise train.seq_length or lower data.payload.image_tokens_max.")
    if d.kind == DataKind.mock:
        tokens = (d.mock_image_size[0] // 32 + 1) * (d.mock_image_size[1] // 32 + 1) * d.mock_num_images
        if tokens >= run.train.seq_length:
            return f"data=mock images need ~{tokens} tokens, more than train.seq_length={run.train.seq_length}."
    return None


@rule(Severity.error)
def data_path_exists(run: RunConfig, res: Resolved) -> str | None:
    d = run.data
    local = d.kind in (DataKind.jsonl, DataKind.parquet, DataKind.energon)
    if local and not (d.path and Path(d.path).expanduser().exists()):
        return f"data={d.kind}: data.path={d.path} does not exist. Point data.path at your {d.kind} data."
    if d.kind == DataKind.jsonl and d.image_dir and not Path(d.image_dir).expanduser().is_dir():
        return f"data=jsonl: data.image_dir={d.image_dir} is not a directory."
    return None


@rule(Severity.warning)
def mock_is_not_performance(run: RunConfig, res: Resolved) -> str | None:
    if run.data.kind == DataKind.mock:
        return ("data=mock: NOT a performance run. Mock VLM data looks ~2x faster than real images (seed); use "
                "data=realistic or your own data before drawing throughput conclusions.")
    return None


@rule(Severity.warning)
def frozen_vision_benchmark_only(run: RunConfig, res: Resolved) -> str | None:
    if run.vision.freeze_vision_model:
        return (f"vision={run.choices.get('vision', 'frozen')}: frozen-vision throughput is benchmark-only; compare it "
                "with frozen runs, never with vision=trainable runs.")
    return None
