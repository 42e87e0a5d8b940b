"""data group: which samples feed the model, always through Bridge's Qwen-VL processor and collate.

| option    | what it is                                                   | Bridge dataset config                  |
|-----------|--------------------------------------------------------------|----------------------------------------|
| sample    | real photos shipped in PyPI wheels, captioned (default)      | DirectHFSFTDatasetConfig (json)        |
| realistic | the photos cut to a declared payload distribution            | DirectHFSFTDatasetConfig (json)        |
| jsonl     | your JSONL + image folder                                    | DirectHFSFTDatasetConfig (json)        |
| parquet   | your parquet file(s) (Bridge schema adapter, default `rdr`)  | DirectHFSFTDatasetConfig (parquet)     |
| hf        | a `save_to_disk` folder, a folder of data files, or a preset | DirectHFSFTDatasetConfig               |
| energon   | an Energon-prepared WebDataset (Bridge's ChatMLWebdataset)   | EnergonDatasetConfig (Qwen-VL encoder) |
| mock      | Bridge's noise images, labelled "mock" everywhere            | MockVLMSFTDatasetConfig                |

Every kind but mock is scanned on CPU before any GPU work (`prepare`, vlmtrain.data.scan): each image is decoded,
and a bad sample fails the run naming the dataset, the sample, the file and the reason, or with
`skip_bad_images=true` is left out of what Bridge reads and counted (`skipped_samples` in metrics.jsonl and W&B).

Padding: samples pad to `seq_length` when CUDA graphs need static shapes or `pad_to_max_length` is set
(Bridge also forces it when PP>1 or EP>1). `packing=true` replaces all of that: the collate turns each micro-batch
into one THD row of its samples' real tokens (Bridge's `pack_right_padded_sequence_batch_to_mcore_thd`), which
Bridge's generic `vlm_step` hands to Qwen3VLModel as PackedSeqParams (per-sample MRoPE and attention boundaries).
Bridge's Qwen3-VL-specific `qwen3_vl_step` would instead defer packing to the step and keep every sample padded
(its `cu_seqlens` are multiples of the padded length), so it is used only without packing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.data.realistic import PayloadDistribution
    from vlmtrain.data.scan import Report
    from vlmtrain.schema import RunConfig


class Kind(StrEnum):
    sample = "sample"
    realistic = "realistic"
    jsonl = "jsonl"
    parquet = "parquet"
    hf = "hf"
    energon = "energon"
    mock = "mock"


OWNS = frozenset({"dataset"})


@dataclass
class PayloadConfig:
    """The declared distribution of `data=realistic` (see vlmtrain.data.realistic.PayloadDistribution)."""

    num_samples: int = 256
    image_tokens_min: int = 196
    """LLM tokens per image (one token = 32x32 px for Qwen3-VL)."""
    image_tokens_max: int = 980
    images_per_sample: list[float] = field(default_factory=lambda: [0.0, 0.7, 0.2, 0.1])
    """Weights of 0, 1, 2, ... images per sample."""
    prompt_words_min: int = 4
    prompt_words_max: int = 24
    answer_words_min: int = 16
    answer_words_max: int = 160
    seed: int = 0


@dataclass
class DataConfig:
    kind: Kind = Kind.sample
    path: str | None = None
    """jsonl file, parquet file or folder, HF dataset folder (save_to_disk or data files) or Bridge preset, or
    Energon dataset folder."""
    image_dir: str | None = None
    """jsonl: folder that relative image paths are resolved against (default: the file's folder)."""
    split: str = "train"
    schema_adapter: str | None = None
    """parquet/hf: Bridge schema adapter (rdr, cord_v2, ...); null = native `conversation` rows."""
    prompt: str = "Describe this image."
    skip_bad_images: bool = False
    """Drop samples whose images are missing or unreadable (counted: skipped_samples) instead of failing."""
    payload: PayloadConfig = field(default_factory=PayloadConfig)
    mock_num_images: int = 1
    mock_image_size: list[int] = field(default_factory=lambda: [256, 256])
    pad_to_max_length: bool = False
    packing: bool = False
    """Collate-time in-batch THD packing: each micro-batch runs as one row of its samples' real tokens, with no
    padding to seq_length (trained through Bridge's vlm_step; see forward_step())."""
    num_workers: int = 2
    cache_dir: str = "~/.cache/vlmtrain"
    """Where the processor and generated datasets are written (idempotent, keyed by content)."""


def is_mock(run: RunConfig) -> bool:
    return run.data.kind == Kind.mock


def cache_dir(run: RunConfig) -> Path:
    return Path(run.data.cache_dir).expanduser()


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
    """The offline Qwen3-VL processor (real Qwen3 tokenizer), built once into the cache."""
    from vlmtrain.data.processor import build_processor

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

    @property
    def jsonl(self) -> Path | None:
        """The checked JSONL copy Bridge reads (sample, realistic, jsonl), else None."""
        return Path(self.report.output) if self.report and self.report.output else None


SCAN_FILE = "data_scan.json"
"""In the run directory: the scan summary and `skipped_samples`, which the metrics callback reads once."""


def payload_distribution(p: PayloadConfig) -> PayloadDistribution:
    """The generator's distribution for data.payload (also what `vlmtrain data export --dataset realistic` uses)."""
    from vlmtrain.data.realistic import PayloadDistribution

    return PayloadDistribution(
        image_tokens_min=p.image_tokens_min,
        image_tokens_max=p.image_tokens_max,
        images_per_sample=list(p.images_per_sample),
        prompt_words_min=p.prompt_words_min,
        prompt_words_max=p.prompt_words_max,
        answer_words_min=p.answer_words_min,
        answer_words_max=p.answer_words_max,
        seed=p.seed,
    )


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
        generated = realistic.generate(payload_distribution(d.payload), d.payload.num_samples, cache / "realistic")
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


def prepare(run: RunConfig) -> Prepared:
    """Scan the data (cached), fail naming the bad samples or, with data.skip_bad_images, point Bridge past them;
    record the outcome in the run directory. Runs in the launcher before torchrun starts the ranks (vlmtrain.run),
    in the dry run and in each rank's build (there a cache hit). Hub datasets (Bridge presets) are not scanned:
    Bridge downloads them in the ranks."""
    from vlmtrain.data import energon, hf

    d = run.data
    with _cache_lock(run):
        report = _scan(run, remote=False)
        if report is None:
            prepared = Prepared(None, _hf_source(run) if d.kind == Kind.hf else None)
        else:
            report.enforce(d.skip_bad_images)
            if report.output:  # sample, realistic, jsonl: the checked copy holds only the good rows
                prepared = Prepared(report, {"path_or_dataset": "json", "split": "train",
                                             "load_kwargs": {"data_files": {"train": report.output}}})
            elif d.kind == Kind.energon:
                prepared = Prepared(report, energon_kwargs=energon.excluding(Path(d.path), report, cache_dir(run))
                                    if report.bad else {})
            else:
                src = _hf_source(run)
                prepared = Prepared(report, hf.without_bad(str(d.kind), src, report, cache_dir(run))
                                    if report.bad else src)
    _record(run, report)
    return prepared


def _record(run: RunConfig, report: Report | None) -> None:
    out = Path(run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"kind": str(run.data.kind), "skipped_samples": 0}
    if report is not None:
        summary.update(dataset=report.dataset, samples=report.samples, images=report.images,
                       skipped_samples=len(report.bad), skipped=report.lines())
    tmp = out / f".{SCAN_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    tmp.replace(out / SCAN_FILE)


def skipped_samples(run: RunConfig) -> int:
    """Samples the data scan dropped for this run (data.skip_bad_images), from the run directory."""
    try:
        return int(json.loads((Path(run.output_dir) / SCAN_FILE).read_text())["skipped_samples"])
    except (OSError, ValueError, KeyError):
        return 0


def forward_step(run: RunConfig) -> Callable[..., Any]:
    """Bridge's forward step for this data: vlm_step takes collate-time packed (THD) batches, qwen3_vl_step the
    padded ones (it refuses packed batches)."""
    if run.data.packing:
        from megatron.bridge.training.vlm_step import forward_step as packed_step

        return packed_step
    from megatron.bridge.models.qwen_vl.qwen3_vl_step import forward_step as padded_step

    return padded_step


def pads_to_max_length(run: RunConfig) -> bool:
    from vlmtrain.groups import cuda_graph

    return run.data.pad_to_max_length or cuda_graph.enabled(run)


def apply(run: RunConfig, cfg: ConfigContainer) -> None:
    d, seq = run.data, run.train.seq_length
    proc = str(processor_dir(run))
    prepared = prepare(run)
    common: dict[str, Any] = dict(
        seq_length=seq,
        num_workers=d.num_workers,
        pad_to_max_length=pads_to_max_length(run),
        enable_in_batch_packing=d.packing,
        defer_in_batch_packing_to_step=False,  # the collate packs; qwen3_vl_step's deferred packing keeps padding
    )
    if d.kind == Kind.mock:
        from megatron.bridge.data.builders.mock_vlm_sft import MockVLMSFTDatasetConfig

        cfg.dataset = MockVLMSFTDatasetConfig(
            hf_processor_path=proc,
            prompt=d.prompt,
            num_images=d.mock_num_images,
            image_size=tuple(d.mock_image_size),
            random_seed=run.train.seed,
            dataloader_type="cyclic",
            **common,
        )
    elif d.kind == Kind.energon:
        from megatron.bridge.data.builders.energon import EnergonDatasetConfig, QwenVLEnergonTaskEncoderConfig

        cfg.dataset = EnergonDatasetConfig(
            path=d.path,
            micro_batch_size=run.train.micro_batch_size,
            task_encoder=QwenVLEnergonTaskEncoderConfig(hf_processor_path=proc, patch_size=16),
            dataset_kwargs=prepared.energon_kwargs,
            **common,
        )
    else:
        from megatron.bridge.data.builders.direct_hf_sft import DirectHFSFTDatasetConfig
        from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

        cfg.dataset = DirectHFSFTDatasetConfig(
            source=HFDatasetSourceConfig(**prepared.hf_source),
            hf_processor_path=proc,
            do_validation=False,
            do_test=False,
            dataloader_type="cyclic",
            **common,
        )
