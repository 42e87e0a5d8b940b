"""Preflight rules of validation: a held-out source (data.validation or data.validation_fraction) that exists, fits
the data kind and fills one evaluation batch, evaluated on a schedule (train.eval_interval) that Bridge can run.
Sizes come from file metadata (vlmtrain.data.validation.count), packed rows from the data stage's bins at the
capacity; the data stage checks the exact size again after the scan (bad samples skipped)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vlmtrain.check.preflight.packing import packed_rows
from vlmtrain.check.preflight.registry import Severity, bridge, rule
from vlmtrain.config.groups.data import Kind, validating
from vlmtrain.config.groups.train import eval_global_batch_size

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

SPLIT_KINDS = (Kind.sample, Kind.realistic, Kind.jsonl, Kind.parquet, Kind.hf)
"""Kinds whose scanned samples a fraction can split (a local hf dataset only)."""
PATH_KINDS = (Kind.jsonl, Kind.parquet, Kind.hf)
"""Kinds that read a held-out file or folder of their own format (data.validation=<path>)."""
ENERGON_SPLIT = "val"
"""The Energon split part Bridge's data module reads for validation (EnergonMultiModalDataModule.val_dataloader)."""


@rule(Severity.error)
def eval_schedule(run: RunConfig, res: Resolved) -> str | None:
    t = run.train
    if t.eval_interval is not None and (t.eval_interval < 1 or t.eval_iters < 1):
        return (f"train.eval_interval={t.eval_interval} with train.eval_iters={t.eval_iters}: evaluation runs every "
                "eval_interval steps on eval_iters batches, both at least 1. Set e.g. train.eval_interval=100 "
                "train.eval_iters=4, or train.eval_interval=null for no validation.")
    return None


@rule(Severity.error)
def eval_interval_needs_validation(run: RunConfig, res: Resolved) -> str | None:
    if run.train.eval_interval is not None and not validating(run):
        return (f"train.eval_interval={run.train.eval_interval} but no held-out samples: set data.validation=<a "
                "held-out file or folder of your data kind> (data=energon: data.validation=val), or "
                "data.validation_fraction=0.05 to hold out that share of the training samples.")
    return None


@rule(Severity.error)
def validation_needs_eval_interval(run: RunConfig, res: Resolved) -> str | None:
    if validating(run) and run.train.eval_interval is None:
        return ("data.validation / data.validation_fraction hold samples out, but train.eval_interval is null, so "
                "nothing would evaluate them. Set train.eval_interval=<steps> (and train.eval_iters=<batches>).")
    return None


@rule(Severity.error)
def validation_fraction_range(run: RunConfig, res: Resolved) -> str | None:
    f = run.data.validation_fraction
    if f is not None and not 0 < f < 1:
        return (f"data.validation_fraction={f}: the share of training samples held out must lie strictly between 0 "
                "and 1, e.g. data.validation_fraction=0.05.")
    return None


@rule(Severity.error)
def validation_source_fits_kind(run: RunConfig, res: Resolved) -> str | None:
    d = run.data
    if d.validation is not None and d.validation_fraction is not None:
        return (f"data.validation={d.validation} and data.validation_fraction={d.validation_fraction}: choose one "
                "held-out source (unset the other with =null).")
    if d.kind == Kind.mock and validating(run):
        return ("data=mock with validation: mock samples are fresh noise, so a held-out loss on them measures "
                "nothing. Validate on real samples: data=sample or data=realistic with data.validation_fraction=0.25, "
                "or your own data.")
    if d.validation_fraction is not None and d.kind not in SPLIT_KINDS:
        return (f"data={d.kind} with data.validation_fraction: Energon shards are split by the dataset's own split "
                f"parts. Prepare a `{ENERGON_SPLIT}` split (split_parts.{ENERGON_SPLIT} in .nv-meta/split.yaml) and "
                f"set data.validation={ENERGON_SPLIT}.")
    if d.validation_fraction is not None and d.kind == Kind.hf and not Path(str(d.path)).expanduser().exists():
        return (f"data=hf data.path={d.path} is a hub dataset, which the data stage does not download to split it. "
                "Set data.validation=<a local held-out folder>, or export the data first (`vlmtrain data export`).")
    if d.validation is not None and d.kind == Kind.energon and d.validation != ENERGON_SPLIT:
        return (f"data=energon data.validation={d.validation}: Bridge's Energon data module validates on the "
                f"dataset's own `{ENERGON_SPLIT}` split part. Set data.validation={ENERGON_SPLIT}.")
    if d.validation is not None and d.kind in (Kind.sample, Kind.realistic):
        return (f"data={d.kind} data.validation={d.validation}: data={d.kind} generates its samples, so hold some "
                "out with data.validation_fraction=<share> instead (or train data=jsonl with your own files).")
    return None


@rule(Severity.error)
def validation_path_exists(run: RunConfig, res: Resolved) -> str | None:
    from vlmtrain.data.validation import count

    d = run.data
    if d.validation is None:
        return None
    if d.kind in PATH_KINDS and not Path(d.validation).expanduser().exists():
        return (f"data={d.kind}: data.validation={d.validation} does not exist. Point data.validation at your "
                f"held-out {d.kind} data, or use data.validation_fraction=<share> of the training samples.")
    if d.kind == Kind.energon and d.validation == ENERGON_SPLIT and d.path and Path(d.path).expanduser().exists() \
            and not count("energon", d.path, ENERGON_SPLIT):
        return (f"data=energon data.path={d.path} has no samples in a `{ENERGON_SPLIT}` split part: add one "
                f"(split_parts.{ENERGON_SPLIT} in .nv-meta/split.yaml, e.g. through Energon's `energon prepare`) or "
                "train without data.validation.")
    return None


@rule(Severity.error)
def validation_fills_eval_batch(run: RunConfig, res: Resolved) -> str | None:
    """One evaluation batch is validation.eval_global_batch_size samples, or packed rows (the data stage's bins of
    the held-out samples at the capacity); a smaller held-out set would repeat samples inside it."""
    from vlmtrain.data.validation import held_out_count

    d = run.data
    packed = packed_rows(run, res) if validating(run) else None
    held = len(packed[0].held_out) if packed else held_out_samples(run)
    rows, batch = packed[2] if packed else held, eval_global_batch_size(run)
    if held is None or rows >= batch:
        return None
    what = (f"data.validation_fraction={d.validation_fraction} holds out {held} samples" if d.validation_fraction
            is not None else f"data.validation={d.validation} holds {held} samples")
    if packed:
        what += f", which pack into {rows} rows of <= {res.packing_capacity} tokens"
    need = next((f" (data.validation_fraction={k / 100:g})" for k in range(1, 100) if d.validation_fraction is not None
                 and not packed and held_out_count(source_samples(run) or 0, k / 100) >= batch), "")
    return (f"{what}, fewer than one evaluation batch of {batch}{' rows' if packed else ''} (train.global_batch_size, "
            f"or +bridge.validation.eval_global_batch_size). Hold out more{need}"
            + (", pack smaller rows (data.packing)" if packed else "")
            + f", or evaluate smaller batches: +bridge.validation.eval_global_batch_size=<at most {rows}, a multiple "
            "of train.micro_batch_size x DP>.")


@rule(Severity.error)
def energon_eval_micro_batch(run: RunConfig, res: Resolved) -> str | None:
    """Bridge's Energon data module batches the validation split with the dataset's micro_batch_size (the training
    one), and Bridge's finalization refuses any other validation.eval_micro_batch_size."""
    mbs = bridge(run, "validation", "eval_micro_batch_size")
    if run.data.kind == Kind.energon and validating(run) and mbs is not None and mbs != run.train.micro_batch_size:
        return (f"data=energon with +bridge.validation.eval_micro_batch_size={mbs}: Energon batches the `val` split "
                f"at train.micro_batch_size={run.train.micro_batch_size}. Drop the override (the default is the "
                "training micro-batch size).")
    return None


def source_samples(run: RunConfig) -> int | None:
    """Samples of the training source from its metadata (before any bad sample is skipped); None when unknown."""
    from vlmtrain.data import PHOTOS
    from vlmtrain.data.validation import count

    d = run.data
    if d.kind == Kind.sample:
        return len(PHOTOS)
    if d.kind == Kind.realistic:
        return d.payload.num_samples
    return count(str(d.kind), d.path, d.split) if d.kind in PATH_KINDS else None


def held_out_samples(run: RunConfig) -> int | None:
    """Samples the run would hold out, from metadata; None when unknown (or no validation)."""
    from vlmtrain.data.validation import count, held_out_count

    d = run.data
    if d.validation_fraction is not None and 0 < d.validation_fraction < 1:
        n = source_samples(run)
        return None if n is None else held_out_count(n, d.validation_fraction)
    if d.validation is not None and d.kind in PATH_KINDS:
        return count(str(d.kind), d.validation, d.split)
    if d.validation == ENERGON_SPLIT and d.kind == Kind.energon:
        return count("energon", d.path, ENERGON_SPLIT) or None  # no such split: validation_path_exists says so
    return None
