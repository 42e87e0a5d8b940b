"""Packing by token budget (`data.packing=<capacity>`): every sample's exact token length and the bins (the Bridge
dataset whose items are bins: vlmtrain.data.bins_dataset). Megatron Bridge is imported only where a length is
counted: with the lengths cached, the launcher bins the data without importing it (the ranks import it anyway).

Decided on CPU before any GPU work (vlmtrain.data.prepare): each sample's length is what Bridge's Qwen collate
(`qwen2_5_collate_fn`) gives it, counted without building pixel tensors (the chat template's tokens, each image
placeholder expanded to the image processor's grid for the picture `qwen_vl_utils` hands the collate). Bins are
filled greedily in data order (deterministic and resumable: the same data always gives the same bins); a sample
longer than the capacity is an error naming it. Nothing is dropped or split.

In training, one dataset item is one bin and one micro-batch is one bin (Bridge sees train.micro_batch_size=1).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.data.scan import BadSample

if TYPE_CHECKING:
    from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

#: Bump when how a length is counted changes: cached lengths are then recomputed.
LENGTHS_VERSION = 1


class SampleTooLong(BadSample):
    """A sample longer than the packing capacity; the message names it, its length and the fix (a bad sample:
    the run stops before any GPU work, as for a bad image)."""


def bridge_examples(source: dict[str, Any] | HFDatasetSourceConfig) -> list[dict[str, Any]]:
    """The examples Bridge's direct-HF dataset trains on, in its order (Bridge's own loader and normalization)."""
    from megatron.bridge.data.builders.direct_hf_sft import load_direct_hf_sft_examples
    from megatron.bridge.data.sft_processing import ChatSFTPreprocessingConfig
    from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

    src = HFDatasetSourceConfig(**source) if isinstance(source, dict) else source
    return load_direct_hf_sft_examples(src, ChatSFTPreprocessingConfig())


def load_processor(processor_dir: str) -> Any:
    """The processor as Bridge's direct-HF dataset loads it (pad token normalized)."""
    from megatron.bridge.data.builders.direct_hf_sft import normalize_direct_hf_sft_processor
    from transformers import AutoProcessor

    return normalize_direct_hf_sft_processor(AutoProcessor.from_pretrained(processor_dir, local_files_only=True))


def sample_length(example: dict[str, Any], processor: Any) -> int:
    """Tokens Bridge's packed Qwen collate gives `example` (its row length before any alignment padding)."""
    from megatron.bridge.data.conversation_processing import chat_template_kwargs_from_example
    from megatron.bridge.models.qwen_vl.data.collate_fn import QWEN_VL_MAX_PIXELS, QWEN_VL_MIN_PIXELS
    from qwen_vl_utils import process_vision_info

    text = processor.apply_chat_template(example["conversation"], tokenize=False,
                                         **chat_template_kwargs_from_example(example))
    images, _ = process_vision_info(example["conversation"])  # the collate's own call: same resized pictures
    ip = processor.image_processor
    merge = ip.merge_size * ip.merge_size
    bounds = {"min_pixels": QWEN_VL_MIN_PIXELS, "max_pixels": QWEN_VL_MAX_PIXELS}
    image_tokens = [ip.get_number_of_image_patches(im.height, im.width, bounds) // merge for im in images or []]
    ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    # the processor expands each image placeholder into that image's tokens
    return len(ids) + sum(image_tokens) - len(image_tokens)


def refuse_longer(lengths: list[int], limit: int, names: list[str] | None, setting: str, fixes: str) -> None:
    """Raise SampleTooLong naming the first sample longer than `limit`, its length, what sets the limit and the
    fixes (`{n}` in `fixes` is that sample's length): packing's capacity and the unpadded row's seq_length."""
    over = [i for i, n in enumerate(lengths) if n > limit]
    if over:
        i, n = over[0], lengths[over[0]]
        more = f" ({len(over)} of {len(lengths)} samples are longer than {limit})" if len(over) > 1 else ""
        name = names[i] if names else f"sample {i}"
        raise SampleTooLong(f"{name} is {n} tokens long but {setting}{more}. " + fixes.format(n=n))


def greedy_bins(lengths: list[int], capacity: int, names: list[str] | None = None, align: int = 1) -> list[list[int]]:
    """Sample indices per bin: in data order, a sample goes into the current bin while its segment (its length
    padded to a multiple of `align`, as the collate pads it) fits, else opens the next one. Raises SampleTooLong
    (naming the first such sample) before any bin is returned."""
    refuse_longer(lengths, capacity, names, f"data.packing={capacity} tokens per micro-batch row: packing never "
                  "splits or drops a sample", "Raise data.packing to at least {n}, or leave such samples out of the "
                  "data (shorter answers or fewer/smaller images; train.seq_length bounds samples only without "
                  "packing).")
    bins: list[list[int]] = []
    used = capacity + 1
    for i, n in enumerate(lengths):
        seg = -(-n // align) * align
        if used + seg > capacity:
            bins.append([])
            used = 0
        bins[-1].append(i)
        used += seg
    return bins


@dataclass
class Bins:
    """The bins of one run's data at one capacity, saved as JSON in the data cache (the rank reads `path`)."""

    capacity: int
    bins: list[list[int]]
    lengths: list[int]
    path: str = ""

    @property
    def fill(self) -> float:
        """Real tokens over the tokens the bins could hold (capacity x bins): the static row's nonpad fraction."""
        return sum(self.lengths) / (self.capacity * len(self.bins)) if self.bins else 0.0

    def bin_tokens(self) -> list[int]:
        return [sum(self.lengths[i] for i in b) for b in self.bins]

    def summary(self) -> str:
        t = self.bin_tokens()
        return (f"{len(self.lengths)} samples in {len(self.bins)} bins of <= {self.capacity} tokens (greedy, data "
                f"order): {min(t)}..{max(t)} tokens per bin, fill {self.fill:.1%}")

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"capacity": self.capacity, "bins": self.bins, "lengths": self.lengths}) + "\n")
        tmp.replace(path)
        self.path = str(path)

    @classmethod
    def load(cls, path: str | Path) -> Bins:
        raw = json.loads(Path(path).read_text())
        return cls(int(raw["capacity"]), raw["bins"], raw["lengths"], str(path))


def sample_lengths(cache: Path, identity: dict[str, Any], source: dict[str, Any],
                   processor_dir: str) -> tuple[list[int], list[str]]:
    """Every sample's length and name ("id x"), cached by what determines them (the source, the files the scan
    read, the processor)."""
    key = hashlib.sha256(json.dumps({**identity, "v": LENGTHS_VERSION}, sort_keys=True).encode()).hexdigest()[:16]
    path = cache / "lengths" / f"{key}.json"
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
            return [int(n) for n in raw["lengths"]], [str(x) for x in raw["names"]]
        except (OSError, ValueError, TypeError, KeyError):
            pass
    processor = load_processor(processor_dir)
    examples = bridge_examples(source)
    lengths = [sample_length(e, processor) for e in examples]
    names = [f"sample {i}" + (f" (id {e['id']})" if e.get("id") is not None else "") for i, e in enumerate(examples)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"lengths": lengths, "names": names}) + "\n")
    tmp.replace(path)
    return lengths, names


def prepare_bins(cache: Path, identity: dict[str, Any], source: dict[str, Any], processor_dir: str,
                 capacity: int, dataset: str, align: int = 1) -> Bins:
    """The bins of the examples Bridge reads from `source` (lengths cached in `cache`), saved for the ranks."""
    lengths, names = sample_lengths(cache, identity, source, processor_dir)
    bins = Bins(capacity, greedy_bins(lengths, capacity, [f"{dataset}: {n}" for n in names], align), lengths)
    key = hashlib.sha256(json.dumps({**identity, "capacity": capacity, "align": align, "v": LENGTHS_VERSION},
                                    sort_keys=True).encode()).hexdigest()[:16]
    bins.save(cache / "bins" / f"{key}.json")
    return bins
