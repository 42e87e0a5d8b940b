"""Preflight rules: the data (images fit the sequence, paths exist) and what a run may be compared with."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vlmtrain.check.preflight.packing import packed_rows
from vlmtrain.check.preflight.registry import Severity, rule
from vlmtrain.config.groups.data import Kind as DataKind
from vlmtrain.config.groups.train import global_batch_size

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
def data_fills_global_batch(run: RunConfig, res: Resolved) -> str | None:
    """An epoch shorter than one step repeats rows inside every step (Megatron's sampler cycles the data). Unpacked a
    row is a sample (counted from file metadata, the held-out ones left out); packed, the data stage's bins at the
    capacity. A warning, not a refusal: a stand-in dataset at a cluster's batch (experiment=3d_gb200 on
    data=realistic) still checks the layout; the auto defaults never pack into it (check.defaults)."""
    from vlmtrain.check.preflight.validation import held_out_samples, source_samples

    gbs, per = global_batch_size(run), run.train.micro_batch_size * res.layout.dp
    packed = packed_rows(run, res)
    if packed is not None:
        lengths, rows, _ = packed
        what = (f"data={run.data.kind}'s {len(lengths.train)} training samples fill {rows} packed rows of <= "
                f"{res.packing_capacity} tokens")
        fix = "a smaller data.packing"
    else:
        samples, held = source_samples(run), held_out_samples(run)
        if samples is None or res.packing_capacity:
            return None
        rows = samples - (held or 0) if run.data.validation_fraction is not None else samples
        what = f"data={run.data.kind} holds {rows} training samples"
        fix = "more samples"
    if rows >= gbs:
        return None
    most = rows // per * per
    lower = f"train.global_batch_size={most}" if most else "fewer GPUs"
    return (f"{what}, fewer than one global batch of train.global_batch_size={gbs}: every step would repeat them. "
            f"Use {lower} (a multiple of train.micro_batch_size x DP {res.layout.dp}) or {fix}.")


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
