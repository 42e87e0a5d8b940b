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

Validation (held out, never trained on; evaluated every train.eval_interval steps by Bridge's own loop):
`validation=<path>` reads a second file or folder of the same kind as `path` (jsonl, parquet, hf; a DatasetDict
folder: its `validation` split), or for energon `validation=val`, the dataset's own `val` split part;
`validation_fraction=f` holds out a fixed share of the training samples (vlmtrain.data.validation: the same
samples every run). The held-out samples are scanned, skipped, length-checked and packed like the training ones,
and reach Bridge as the dataset config's validation split (DirectHFSFTDatasetConfig.validation_source,
EnergonDatasetConfig.do_validation, the packed config's validation bins).

Padding: samples pad to `seq_length` when CUDA graphs need static shapes or `pad_to_max_length` is set
(Bridge also forces it when PP>1 or EP>1). `packing=<capacity>` replaces all of that: before any GPU work the data
stage bins the samples in data order into bins of <= capacity tokens (vlmtrain.data.bins), one micro-batch is one
bin, and the collate turns it into one THD row of its samples' real tokens (Bridge's packed `qwen2_5_collate_fn`),
which Bridge's generic `vlm_step` hands to Qwen3VLModel as PackedSeqParams (per-sample MRoPE and attention
boundaries); `packing_static=true` (forced by CUDA graphs and PP>1) pads the row to exactly the capacity. Bridge
sees train.micro_batch_size=1 and train.global_batch_size bins per step, and model.seq_length = the capacity.
Bridge's Qwen3-VL-specific `qwen3_vl_step` would instead defer packing to the step and keep every sample padded
(its `cu_seqlens` are multiples of the padded length), so it is used only without packing. `packing=auto` (the
default) is settled where the run is placed (vlmtrain.check.defaults): a capacity where packing is proven and fits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.config.tokens import COLLATE_MAX_TOKENS, COLLATE_MIN_TOKENS

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
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
AUTO = "auto"
"""data.packing's default: settled where the run is placed (check.defaults)."""


class TokenSampling(StrEnum):
    uniform = "uniform"
    log_uniform = "log_uniform"


@dataclass
class PayloadConfig:
    """The declared per-sample payload mix of `data=realistic`, which vlmtrain.data.realistic generates; the
    defaults are what `data=realistic` trains with. Every field but num_samples is the distribution, part of the
    generated dataset's identity (`identity()`)."""

    num_samples: int = 256
    """Samples generated."""
    image_tokens_min: int = COLLATE_MIN_TOKENS
    """Fewest LLM tokens per image (one token = 32x32 px); clamped to >= 196, the collate's minimum."""
    image_tokens_max: int = COLLATE_MAX_TOKENS
    """Most LLM tokens per image; clamped to <= 980, the collate's maximum."""
    images_per_sample: list[float] = field(default_factory=lambda: [0.0, 0.7, 0.2, 0.1])
    """Weight of each image count: entry k is the relative probability of k images in a sample."""
    token_sampling: TokenSampling = TokenSampling.uniform
    """How the per-image token target is drawn between min and max."""
    aspect_ratio_max: float = 2.0
    """Largest long/short side ratio of a crop; crop aspect ratios are log-uniform in [1/r, r]."""
    prompt_words_min: int = 4
    """Fewest words in the user prompt."""
    prompt_words_max: int = 24
    """Most words in the user prompt."""
    answer_words_min: int = 16
    """Fewest words in the assistant answer (the loss-carrying tokens)."""
    answer_words_max: int = 160
    """Most words in the assistant answer."""
    seed: int = 0
    """Seed of the only random generator used; same seed and fields give byte-identical images and rows."""

    def __post_init__(self) -> None:
        """Normalise the weights to floats and reject ranges that cannot be sampled."""
        self.images_per_sample = [float(w) for w in self.images_per_sample]
        weights = self.images_per_sample
        if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"images_per_sample needs non-negative weights with a positive sum, got {weights}")
        if self.token_sampling not in tuple(TokenSampling):
            raise ValueError(f"token_sampling must be 'uniform' or 'log_uniform', got {self.token_sampling!r}")
        self.token_sampling = TokenSampling(self.token_sampling)
        lo, hi = self.effective_token_range
        if lo > hi:
            raise ValueError(
                f"image_tokens_min..max ({self.image_tokens_min}..{self.image_tokens_max}) does not overlap "
                f"the collate's {COLLATE_MIN_TOKENS}..{COLLATE_MAX_TOKENS}; pick a range inside it."
            )
        if self.aspect_ratio_max < 1:
            raise ValueError(f"aspect_ratio_max must be >= 1, got {self.aspect_ratio_max}")
        for name in ("prompt_words", "answer_words"):
            low, high = getattr(self, f"{name}_min"), getattr(self, f"{name}_max")
            if not 1 <= low <= high:
                raise ValueError(f"need 1 <= {name}_min <= {name}_max, got {low}..{high}")

    @property
    def effective_token_range(self) -> tuple[int, int]:
        """Declared token range clamped to what the Qwen collate keeps unchanged."""
        return max(self.image_tokens_min, COLLATE_MIN_TOKENS), min(self.image_tokens_max, COLLATE_MAX_TOKENS)

    def identity(self) -> dict[str, Any]:
        """The distribution (every field but num_samples), as the dataset key and the manifest record it."""
        return {k: v for k, v in asdict(self).items() if k != "num_samples"}


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
    truncate_long_samples: bool = False
    """Without packing: train a sample longer than train.seq_length on its first seq_length tokens (counted:
    truncated_samples) instead of refusing the run before GPU work."""
    payload: PayloadConfig = field(default_factory=PayloadConfig)
    mock_num_images: int = 1
    mock_image_size: list[int] = field(default_factory=lambda: [256, 256])
    pad_to_max_length: bool = False
    packing: Any = AUTO
    """false (off), the capacity: tokens per micro-batch row, or auto (the default). Samples are binned in data
    order into rows of <= capacity real tokens (none dropped or split; a longer sample is an error), one bin per
    micro-batch, trained through Bridge's vlm_step (see forward_step()). auto: where the run is placed
    (check.defaults), the largest capacity up to 3 x train.seq_length that the memory estimate fits, wherever
    packing is proven and possible, else off (preflight says why); a run resolved without placement reads it as
    off."""
    packing_static: bool = False
    """Pad every packed row to exactly the capacity (static shapes; forced by CUDA graphs and PP>1): one padding
    span at the row's end, loss-masked, counted as padding."""
    validation: str | None = None
    """Held-out samples evaluated every train.eval_interval steps: a file or folder of the same kind as data.path
    (jsonl, parquet, hf), or `val` for data=energon (the dataset's own val split). null = none."""
    validation_fraction: float | None = None
    """Hold out this share (0 < f < 1) of the training samples instead: the same samples every run, never trained
    on (vlmtrain.data.validation). null = none."""
    num_workers: int = 2
    cache_dir: str = "~/.cache/vlmtrain"
    """Where the processor and generated datasets are written (idempotent, keyed by content)."""

    def __post_init__(self) -> None:
        """data.packing is a capacity: refuse the old boolean form and anything but a positive token count."""
        p = self.packing
        if p is True:
            raise ValueError("data.packing=true is no longer a packing mode: data.packing is the capacity in tokens "
                             "per micro-batch row, e.g. data.packing=8192 with train.micro_batch_size=1 "
                             "(train.global_batch_size then counts rows); data.packing=false turns it off.")
        if p is not False and p != AUTO and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
            raise ValueError(f"data.packing={p!r}: use false, auto or a positive number of tokens per micro-batch "
                             "row, e.g. data.packing=8192.")


def capacity(run: RunConfig) -> int | None:
    """Tokens per packed micro-batch row (data.packing), or None without packing (an unsettled auto included)."""
    return None if run.data.packing is False or run.data.packing == AUTO else int(run.data.packing)


def row_length(run: RunConfig) -> int:
    """Bridge's model.seq_length and dataset seq_length: the packing capacity, else train.seq_length."""
    return capacity(run) or run.train.seq_length


def validating(run: RunConfig) -> bool:
    """The run holds samples out for validation (data.validation or data.validation_fraction)."""
    return run.data.validation is not None or run.data.validation_fraction is not None


def is_mock(run: RunConfig) -> bool:
    return run.data.kind == Kind.mock


def cache_dir(run: RunConfig) -> Path:
    return Path(run.data.cache_dir).expanduser()


def forward_step(run: RunConfig) -> Callable[..., Any]:
    """Bridge's forward step for this data: vlm_step takes collate-time packed (THD) batches, qwen3_vl_step the
    padded ones (it refuses packed batches)."""
    if capacity(run):
        from megatron.bridge.training.vlm_step import forward_step as packed_step

        return packed_step
    from megatron.bridge.models.qwen_vl.qwen3_vl_step import forward_step as padded_step

    return padded_step


def pads_to_max_length(run: RunConfig) -> bool:
    from vlmtrain.config.groups import cuda_graph

    return run.data.pad_to_max_length or cuda_graph.enabled(run)


def apply(run: RunConfig, res: Resolved, cfg: ConfigContainer, proc: str, hf_source: dict[str, Any] | None,
          energon_kwargs: dict[str, Any], packed: Callable[..., Any] | None = None,
          validation_source: dict[str, Any] | None = None) -> None:
    """Bridge's dataset config on the processor `proc` and the source the data scan left (vlmtrain.data.prepare).
    `packed`: with a packing capacity, the data stage's dataset config bound to this run's bins
    (vlmtrain.data.bins_dataset.PackedBinsDatasetConfig). `validation_source`: the held-out samples' source
    (data.validation or data.validation_fraction; energon validates on its own `val` split)."""
    d, seq = run.data, run.train.seq_length
    if validating(run) and validation_source is None and d.kind != Kind.energon:
        raise ValueError("data.validation / data.validation_fraction need the data stage's held-out source "
                         "(vlmtrain.data.prepare)")
    if capacity(run):
        if packed is None or hf_source is None:
            raise ValueError(f"data.packing={d.packing} needs the data stage's bins of a scanned source "
                             "(preflight: packing_needs_scanned_data)")
        from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

        cfg.dataset = packed(seq_length=res.packing_capacity, source=HFDatasetSourceConfig(**hf_source),
                             hf_processor_path=proc, static=res.packing_static, pack_align=res.pack_align,
                             num_workers=d.num_workers)
        return
    common: dict[str, Any] = dict(
        seq_length=seq,
        num_workers=d.num_workers,
        pad_to_max_length=pads_to_max_length(run),
        defer_in_batch_packing_to_step=False,  # qwen3_vl_step's deferred packing would keep padding
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

        from vlmtrain.config.architecture import PATCH_SIZE

        cfg.dataset = EnergonDatasetConfig(
            path=d.path,
            micro_batch_size=run.train.micro_batch_size,
            task_encoder=QwenVLEnergonTaskEncoderConfig(hf_processor_path=proc, patch_size=PATCH_SIZE),
            dataset_kwargs=energon_kwargs,
            do_validation=validating(run),  # Bridge's Energon data module reads the dataset's `val` split part
            **common,
        )
    else:
        from megatron.bridge.data.builders.direct_hf_sft import DirectHFSFTDatasetConfig
        from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

        cfg.dataset = DirectHFSFTDatasetConfig(
            source=HFDatasetSourceConfig(**hf_source),
            validation_source=HFDatasetSourceConfig(**validation_source) if validation_source else None,
            hf_processor_path=proc,
            do_validation=validation_source is not None,
            do_test=False,
            dataloader_type="cyclic",
            **common,
        )
