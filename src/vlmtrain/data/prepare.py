"""What the data group's files become before Bridge reads them: the processor, the scan of every sample and the
source Bridge reads (the checked copy, or the dataset without its bad samples), in the shared cache.

Runs on CPU before any GPU work (vlmtrain.data.scan decodes each image): a bad sample fails the run naming the
dataset, the sample, the file and the reason, or with `data.skip_bad_images=true` is left out and counted. With
`data.packing=<capacity>` it also bins the samples Bridge will read (vlmtrain.data.bins): a sample longer than the
capacity fails here; without packing a sample longer than train.seq_length fails here the same way, unless
`data.truncate_long_samples=true` (then counted). The held-out samples (data.validation, data.validation_fraction:
vlmtrain.data.validation) go through the same scan, skipping, length check and binning, and must fill one
evaluation batch.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.config.groups.data import Kind, cache_dir, validating
from vlmtrain.config.groups.train import eval_global_batch_size
from vlmtrain.data import rows, validation

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.data.bins import Bins
    from vlmtrain.data.scan import Report


@contextlib.contextmanager
def _cache_lock(run: RunConfig) -> Iterator[None]:
    """One writer at a time in the cache (ranks and side-by-side runs share it)."""
    cache_dir(run).mkdir(parents=True, exist_ok=True)
    with (cache_dir(run) / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def processor_dir(run: RunConfig) -> Path:
    """`model.hf_path` when that dir holds its tokenizer and processor, else the offline Qwen3-VL processor (real
    Qwen3 tokenizer), built once into the cache."""
    from vlmtrain.config import hf_checkpoint
    from vlmtrain.data.processor import build_processor

    if run.model.hf_path and hf_checkpoint.has_processor(run.model.hf_path):
        return Path(run.model.hf_path)

    with _cache_lock(run):
        return build_processor(cache_dir(run) / "processor-qwen3vl")


@dataclass
class Prepared:
    """What the data scan leaves for Bridge (vlmtrain.data.scan): the report, and the source Bridge reads."""

    report: Report | None
    """None for mock data (no files)."""
    hf_source: dict[str, Any] | None = None
    """HFDatasetSourceConfig fields: the checked JSONL copy, the parquet/hf source, or its filtered copy."""
    energon_kwargs: dict[str, Any] = field(default_factory=dict)
    """EnergonDatasetConfig.dataset_kwargs (a split config excluding the bad samples, when skipped)."""
    bins: Bins | None = None
    """With data.packing=<capacity>: the bins of hf_source's samples (saved in the cache for the ranks)."""
    validation: dict[str, Any] | None = None
    """HFDatasetSourceConfig fields of the held-out samples (data.validation or data.validation_fraction; None
    without validation and for energon, which reads its own `val` split)."""
    validation_bins: Bins | None = None
    """With packing and validation: the bins of the held-out samples."""
    validation_samples: int = 0
    """Held-out samples Bridge evaluates on (energon: its `val` split's good samples)."""
    validation_skipped: int = 0
    """Held-out samples dropped for bad images (data.skip_bad_images; a fraction's are in the training count)."""

    def packed_dataset(self) -> Any:
        """The data group's factory for a packed run: Bridge dataset configs bound to these bins (and the held-out
        samples' bins)."""
        import functools

        from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

        from vlmtrain.data.bins_dataset import PackedBinsDatasetConfig

        if not self.bins:
            return None
        held_out = {"validation_source": HFDatasetSourceConfig(**self.validation),
                    "validation_bins_file": self.validation_bins.path} if self.validation_bins else {}
        return functools.partial(PackedBinsDatasetConfig, bins_file=self.bins.path, **held_out)

    @property
    def jsonl(self) -> Path | None:
        """The checked JSONL copy Bridge reads (sample, realistic, jsonl), else None."""
        return Path(self.report.output) if self.report and self.report.output else None


SCAN_FILE = "data_scan.json"
"""In the run directory: the scan summary and `skipped_samples`, which the metrics callback reads once."""


def scan(run: RunConfig) -> Report | None:
    """The (cached) scan of every sample this run reads, on CPU (hub datasets downloaded through `datasets`):
    `vlmtrain data check` prints it."""
    with _cache_lock(run):
        return _scan(run, remote=True)


def _hf_source(run: RunConfig) -> dict[str, Any]:
    from vlmtrain.data import hf

    d = run.data
    return hf.source(str(d.kind), str(d.path), d.split, d.schema_adapter, d.prompt)


def _scan(run: RunConfig, remote: bool) -> Report | None:
    """None: nothing to scan (mock), or a hub dataset and not `remote` (a run does not download it to scan it)."""
    from vlmtrain.data import energon, hf, jsonl, realistic, sample

    d, cache, seq = run.data, cache_dir(run), run.train.seq_length
    if d.kind == Kind.sample:
        return jsonl.scan(sample.write_sample_dataset(cache / "sample"), None, cache, seq, kind="sample")
    if d.kind == Kind.realistic:
        generated = realistic.generate(d.payload, d.payload.num_samples, cache / "realistic")
        return jsonl.scan(generated, None, cache, seq, kind="realistic")
    if d.kind == Kind.jsonl:
        return jsonl.scan(Path(d.path), d.image_dir, cache, seq)
    if d.kind in (Kind.parquet, Kind.hf):
        src = _hf_source(run)
        return hf.scan(str(d.kind), str(Path(d.path).expanduser()), src, cache, seq) if remote or hf.local(src) \
            else None
    if d.kind == Kind.energon:
        return energon.scan(Path(d.path), cache, seq)
    return None


def prepare(run: RunConfig, res: Resolved) -> Prepared:
    """Scan the data (cached), fail naming the bad samples or, with data.skip_bad_images, point Bridge past them;
    with a packing capacity (`res`), bin them; record the outcome in the run directory. Runs in the launcher
    before torchrun starts the ranks (vlmtrain.flow), in the dry run and in each rank's build (there a cache hit).
    Hub datasets (Bridge presets) are not scanned: Bridge downloads them in the ranks."""
    from vlmtrain.data import energon

    d = run.data
    with _cache_lock(run):
        report = _scan(run, remote=False)
        if report is None:
            prepared = Prepared(None, _hf_source(run) if d.kind == Kind.hf else None)
        elif d.kind == Kind.energon:
            report.enforce(d.skip_bad_images)
            held = _energon_val(run) if validating(run) else None
            bad = report.bad_refs | (held.bad_refs if held else set())
            prepared = Prepared(report, energon_kwargs=energon.excluding(Path(d.path), bad, cache_dir(run))
                                if bad else {})
            if held:
                prepared.validation_samples, prepared.validation_skipped = held.samples - len(held.bad), len(held.bad)
        else:
            report.enforce(d.skip_bad_images)
            prepared = Prepared(report, _good_source(run, report))
        held_report = _hold_out(run, report, prepared) if validating(run) and d.kind != Kind.energon else None
    truncated = None
    if report is not None and prepared.hf_source is not None:  # atomic cache writes: no lock needed
        if res.packing_capacity:
            prepared.bins = rows.bin_source(run, res, report, prepared.hf_source, str(processor_dir(run)))
        else:
            truncated = rows.fit(run, report, prepared.hf_source, str(processor_dir(run)))
    if prepared.validation is not None:
        _fit_held_out(run, res, held_report or report, prepared, str(processor_dir(run)))
    _record(run, report, prepared.bins, truncated, prepared)
    return prepared


_SAID: set[str] = set()


def lengths(run: RunConfig) -> rows.Lengths | None:
    """The exact lengths of the samples this run would train on and hold out (the good ones, after the hold-out
    split; cached), before any GPU work: the rows the defaults and preflight count. None where the data stage
    cannot count them here (mock, Energon, hub data; missing or unusable data, which the data stage names), and
    where it refuses the data (bad samples not skipped): counting them would import Bridge for a run that stops."""
    if run.data.kind == Kind.energon:
        return None
    try:
        proc = str(processor_dir(run))
        with _cache_lock(run):  # the lengths too: a run beside this one may be rewriting the checked copy they stat
            report = _scan(run, remote=False)
            if report is None or len(report.bad) == report.samples or (report.bad and not run.data.skip_bad_images):
                return None
            prepared = Prepared(report, _good_source(run, report))
            held_report = _hold_out(run, report, prepared) if validating(run) else None
            train, _ = rows.source_lengths(run, report, prepared.hf_source, proc)
            held = rows.source_lengths(run, held_report or report, prepared.validation, proc)[0] \
                if prepared.validation else []
    except (OSError, ValueError) as e:  # a BadSample too: the data stage says what is wrong with the data
        why = f"[vlmtrain] the data's sample lengths are not known before the run ({type(e).__name__}: {e})"
        if why not in _SAID:  # the defaults, preflight and the plan each ask: say it once
            _SAID.add(why)
            print(why, file=sys.stderr)
        return None
    return rows.Lengths(tuple(train), tuple(held))


def _good_source(run: RunConfig, report: Report) -> dict[str, Any]:
    """HFDatasetSourceConfig fields of the scanned samples without the bad ones: the checked JSONL copy (sample,
    realistic, jsonl), else the parquet/hf source or its filtered copy."""
    from vlmtrain.data import hf

    if report.output:  # the checked copy holds only the good rows
        return _json_source(Path(report.output))
    src = _hf_source(run)
    return hf.without_bad(str(run.data.kind), src, report, cache_dir(run)) if report.bad else src


def _energon_val(run: RunConfig) -> Report:
    """The scan of an Energon dataset's own `val` split (data.validation=val), enforced like the training split's;
    Bridge's data module reads it with the training micro-batch size."""
    from vlmtrain.data import energon

    d = run.data
    report = energon.scan(Path(d.path), cache_dir(run), run.train.seq_length, split="val")
    report.enforce(d.skip_bad_images)
    validation.require_batch(report.samples - len(report.bad), eval_global_batch_size(run),
                             f"data=energon {d.path} split `val` (data.validation=val)")
    return report


def _hold_out(run: RunConfig, report: Report | None, prepared: Prepared) -> Report | None:
    """Set prepared.validation (and, for a fraction, narrow prepared.hf_source to the training copy): a split of the
    scanned training samples, or data.validation scanned like data.path. Returns the held-out file's own report
    (None for a fraction: the training scan covers it)."""
    from vlmtrain.data import hf, jsonl

    d, cache, seq = run.data, cache_dir(run), run.train.seq_length
    if d.validation_fraction is not None:
        if report is None or prepared.hf_source is None:
            raise ValueError(f"data.validation_fraction needs samples the scan reads (data={d.kind} "
                             f"data.path={d.path} is not local); set data.validation=<a local held-out set>.")
        if report.output:
            train, val = validation.split_jsonl(Path(report.output), d.validation_fraction, cache / "validation")
            prepared.hf_source, prepared.validation = _json_source(train), _json_source(val)
        else:
            prepared.hf_source, prepared.validation = validation.split_rows(
                prepared.hf_source, d.validation_fraction, cache / "validation", report.files)
        return None
    if d.kind == Kind.jsonl:
        held = jsonl.scan(Path(d.validation), d.image_dir, cache, seq)
        held.enforce(d.skip_bad_images)
        prepared.validation, prepared.validation_skipped = _json_source(Path(held.output)), len(held.bad)
        return held
    src = hf.source(str(d.kind), str(Path(d.validation).expanduser()), validation.split_of(d.validation, d.split),
                    d.schema_adapter, d.prompt)
    held = hf.scan(str(d.kind), str(Path(d.validation).expanduser()), src, cache, seq)
    held.enforce(d.skip_bad_images)
    prepared.validation = hf.without_bad(str(d.kind), src, held, cache) if held.bad else src
    prepared.validation_skipped = len(held.bad)
    return held


def _json_source(path: Path) -> dict[str, Any]:
    """HFDatasetSourceConfig fields of a JSONL copy in the data cache."""
    return {"path_or_dataset": "json", "split": "train", "load_kwargs": {"data_files": {"train": str(path)}}}


def _fit_held_out(run: RunConfig, res: Resolved, report: Report, prepared: Prepared, proc: str) -> None:
    """The held-out samples' lengths checked (or binned) as the training ones, and one evaluation batch of them
    (packed: of rows) required."""
    batch = eval_global_batch_size(run)
    if res.packing_capacity:
        prepared.validation_bins = rows.bin_source(run, res, report, prepared.validation, proc)
        prepared.validation_samples = len(prepared.validation_bins.lengths)
        validation.require_batch(len(prepared.validation_bins.bins), batch,
                                 f"the held-out set packed into data.packing={res.packing_capacity} rows", "rows")
        return
    rows.fit(run, report, prepared.validation, proc)
    prepared.validation_samples = len(rows.source_lengths(run, report, prepared.validation, proc)[0])
    validation.require_batch(prepared.validation_samples, batch,
                             "the held-out set (data.validation / data.validation_fraction)")


def _record(run: RunConfig, report: Report | None, packed: Bins | None = None,
            truncated: dict[str, int] | None = None, prepared: Prepared | None = None) -> None:
    out = Path(run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"kind": str(run.data.kind), "skipped_samples": 0}
    if report is not None:
        summary.update(dataset=report.dataset, samples=report.samples, images=report.images,
                       skipped_samples=len(report.bad), skipped=report.lines())
    if packed is not None:
        summary["packing"] = {"capacity": packed.capacity, "bins": len(packed.bins), "fill": packed.fill,
                              "bin_tokens_min": min(packed.bin_tokens()), "bin_tokens_max": max(packed.bin_tokens())}
    if truncated is not None:
        summary.update(truncated_samples=truncated["samples"], truncated_tokens=truncated["tokens"])
    if prepared is not None and validating(run):  # what the run evaluates on; energon: its `val` split
        d = run.data
        summary["validation"] = {"samples": prepared.validation_samples, "skipped_samples": prepared.validation_skipped,
                                 "fraction": d.validation_fraction, "path": d.validation,
                                 "source": prepared.validation or {"energon_split": "val"}}
        if prepared.validation_bins is not None:
            summary["validation"]["bins"] = len(prepared.validation_bins.bins)
    tmp = out / f".{SCAN_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    tmp.replace(out / SCAN_FILE)


def skipped_samples(run: RunConfig) -> int:
    """Samples the data scan dropped for this run (data.skip_bad_images), from the run directory."""
    return scan_count(run, "skipped_samples")


def scan_count(run: RunConfig, key: str) -> int:
    """One count of this run's data_scan.json (skipped_samples, truncated_samples); 0 when absent."""
    try:
        return int(json.loads((Path(run.output_dir) / SCAN_FILE).read_text())[key])
    except (OSError, ValueError, KeyError):
        return 0
