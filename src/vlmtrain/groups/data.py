"""data group: which samples feed the model, always through Bridge's Qwen-VL processor and collate.

| option    | what it is                                              | Bridge dataset config                  |
|-----------|---------------------------------------------------------|----------------------------------------|
| sample    | real photos shipped in PyPI wheels, captioned (default) | DirectHFSFTDatasetConfig (json)        |
| realistic | the photos cut to a declared payload distribution       | DirectHFSFTDatasetConfig (json)        |
| jsonl     | your JSONL + image folder (checked before any GPU work) | DirectHFSFTDatasetConfig (json)        |
| parquet   | your parquet (Bridge schema adapter, default `rdr`)     | DirectHFSFTDatasetConfig (parquet)     |
| hf        | a Hugging Face dataset (Bridge preset or path)          | DirectHFSFTDatasetConfig               |
| energon   | an Energon (WebDataset) dataset                         | EnergonDatasetConfig (Qwen-VL encoder) |
| mock      | Bridge's noise images, labelled "mock" everywhere       | MockVLMSFTDatasetConfig                |

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

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
    """jsonl/parquet file, HF dataset preset or path, or Energon dataset directory."""
    image_dir: str | None = None
    """jsonl: folder that relative image paths are resolved against (default: the file's folder)."""
    split: str = "train"
    schema_adapter: str | None = None
    """parquet/hf: Bridge schema adapter (rdr, cord_v2, ...); null = native `conversation` rows."""
    prompt: str = "Describe this image."
    skip_bad_images: bool = False
    """jsonl: drop samples whose images are missing or unreadable (counted and reported) instead of failing."""
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


def prepare(run: RunConfig) -> Path | None:
    """Materialize the samples this run reads and return the JSONL Bridge loads (None: Bridge reads directly)."""
    with _cache_lock(run):
        return _prepare(run)


def _prepare(run: RunConfig) -> Path | None:
    from vlmtrain.data import jsonl, realistic, sample

    d = run.data
    if d.kind == Kind.sample:
        return sample.write_sample_dataset(cache_dir(run) / "sample")
    if d.kind == Kind.realistic:
        p = d.payload
        dist = realistic.PayloadDistribution(
            image_tokens_min=p.image_tokens_min,
            image_tokens_max=p.image_tokens_max,
            images_per_sample=list(p.images_per_sample),
            prompt_words_min=p.prompt_words_min,
            prompt_words_max=p.prompt_words_max,
            answer_words_min=p.answer_words_min,
            answer_words_max=p.answer_words_max,
            seed=p.seed,
        )
        return realistic.generate(dist, p.num_samples, cache_dir(run) / "realistic")
    if d.kind == Kind.jsonl:
        return jsonl.resolve(
            Path(d.path),
            d.image_dir,
            cache_dir(run) / "jsonl",
            seq_length=run.train.seq_length,
            skip_bad=d.skip_bad_images,
        )
    return None


def _hf_source(run: RunConfig, prepared: Path | None) -> Any:
    from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

    d = run.data
    if prepared is not None:
        return HFDatasetSourceConfig(
            path_or_dataset="json", split="train", load_kwargs={"data_files": {"train": str(prepared)}}
        )
    if d.kind == Kind.parquet:
        return HFDatasetSourceConfig(
            path_or_dataset="parquet",
            split="train",
            load_kwargs={"data_files": {"train": str(Path(d.path).expanduser())}},
            schema_adapter=d.schema_adapter or "rdr",
            adapter_kwargs={"prompt": d.prompt},
        )
    from megatron.bridge.data.sources.hf import _HF_DATASET_PRESETS

    if d.path in _HF_DATASET_PRESETS:
        return HFDatasetSourceConfig(dataset_name=d.path, split=d.split)
    return HFDatasetSourceConfig(path_or_dataset=d.path, split=d.split, schema_adapter=d.schema_adapter)


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
            **common,
        )
    else:
        from megatron.bridge.data.builders.direct_hf_sft import DirectHFSFTDatasetConfig

        cfg.dataset = DirectHFSFTDatasetConfig(
            source=_hf_source(run, prepare(run)),
            hf_processor_path=proc,
            do_validation=False,
            do_test=False,
            dataloader_type="cyclic",
            **common,
        )
