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

Every kind but mock is scanned on CPU before any GPU work (vlmtrain.data.prepare): each image is decoded,
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

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.schema import RunConfig


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


def forward_step(run: RunConfig) -> Callable[..., Any]:
    """Bridge's forward step for this data: vlm_step takes collate-time packed (THD) batches, qwen3_vl_step the
    padded ones (it refuses packed batches)."""
    if run.data.packing:
        from megatron.bridge.training.vlm_step import forward_step as packed_step

        return packed_step
    from megatron.bridge.models.qwen_vl.qwen3_vl_step import forward_step as padded_step

    return padded_step


def pads_to_max_length(run: RunConfig) -> bool:
    from vlmtrain.config.groups import cuda_graph

    return run.data.pad_to_max_length or cuda_graph.enabled(run)


def apply(run: RunConfig, cfg: ConfigContainer, proc: str, hf_source: dict[str, Any] | None,
          energon_kwargs: dict[str, Any]) -> None:
    """Bridge's dataset config on the processor `proc` and the source the data scan left (vlmtrain.data.prepare)."""
    d, seq = run.data, run.train.seq_length
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
            dataset_kwargs=energon_kwargs,
            **common,
        )
    else:
        from megatron.bridge.data.builders.direct_hf_sft import DirectHFSFTDatasetConfig
        from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

        cfg.dataset = DirectHFSFTDatasetConfig(
            source=HFDatasetSourceConfig(**hf_source),
            hf_processor_path=proc,
            do_validation=False,
            do_test=False,
            dataloader_type="cyclic",
            **common,
        )
