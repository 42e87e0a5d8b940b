"""The Bridge dataset of a packed run (`data.packing=<capacity>`): its items are the bins vlmtrain.data.bins made.

`PackedBinsDatasetConfig` builds the examples with Bridge's own loader, and its collate hands the bin's samples to
Bridge's `qwen2_5_collate_fn` with `enable_in_batch_packing=True`, so the row is exactly Bridge's packed row. With
`static`, the row is then padded to the capacity: one span at its end that belongs to the last sample's padded
segment (`cu_seqlens_q_padded`), labels IGNORE and loss_mask 0, so every micro-batch has the same shape. The row
also carries its samples' `sample_index` under `sample_ids` (vlmtrain.data.sample_ids), in row order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider
from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

from vlmtrain.data import sample_ids
from vlmtrain.data.bins import Bins, SampleTooLong, bridge_examples, load_processor


def pad_row_to(batch: dict[str, Any], capacity: int) -> dict[str, Any]:
    """Pad a packed (THD) row to exactly `capacity` tokens: one span at the end, inside the last sample's padded
    segment (cu_seqlens_q_padded; cu_seqlens_q keeps the real lengths), labels IGNORE, loss_mask 0, token 0."""
    import torch
    from megatron.bridge.data.datasets.utils import IGNORE_INDEX

    ids = batch["input_ids"]
    tail = capacity - ids.shape[1]
    if tail < 0:
        raise SampleTooLong(f"a packed row of {ids.shape[1]} tokens exceeds data.packing={capacity}")
    if tail == 0:
        return batch
    pos = batch["position_ids"]
    fills = {"input_ids": 0, "labels": IGNORE_INDEX, "loss_mask": 0}
    for key, value in fills.items():
        t = batch[key]
        batch[key] = torch.cat([t, t.new_full((1, tail), value)], dim=1)
    start = int(pos[0, -1]) + 1
    batch["position_ids"] = torch.cat([pos, torch.arange(start, start + tail, dtype=pos.dtype).unsqueeze(0)], dim=1)
    padded = batch.get("cu_seqlens_q_padded", batch["cu_seqlens_q"]).clone()
    padded[-1] = capacity
    batch["cu_seqlens_q_padded"] = batch["cu_seqlens_kv_padded"] = padded
    longest = int((padded[1:] - padded[:-1]).max())
    batch["max_seqlen_q"] = batch["max_seqlen_kv"] = torch.tensor(longest, dtype=torch.int32)
    batch["total_tokens"] = capacity
    return batch


class BinDataset:
    """Bridge-facing dataset: item i is bin i (wrapping around, as Bridge's DirectSFTDataset wraps samples), and
    `collate_fn` packs a micro-batch of bins into one row through Bridge's Qwen collate, with the row's sample ids."""

    def __init__(self, examples: list[dict[str, Any]], bins: list[list[int]], length: int, processor: Any,
                 capacity: int, static: bool, align: int):
        self.examples, self.bins, self.length = examples, bins, length
        self.processor, self.capacity, self.static, self.align = processor, capacity, static, align

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> list[dict[str, Any]]:
        return [self.examples[i] for i in self.bins[idx % len(self.bins)]]

    def collate_fn(self, items: list[list[dict[str, Any]]]) -> dict[str, Any]:
        from megatron.bridge.models.qwen_vl.data.collate_fn import qwen2_5_collate_fn

        examples = [e for item in items for e in item]
        batch = qwen2_5_collate_fn(examples, self.processor, sequence_length=self.capacity,
                                   enable_in_batch_packing=True, in_batch_packing_pad_to_multiple_of=self.align)
        batch = pad_row_to(batch, self.capacity) if self.static else batch
        batch[sample_ids.BATCH_KEY] = sample_ids.ids(examples)
        return batch


@dataclass(kw_only=True)
class PackedBinsDatasetConfig(DatasetProvider):
    """Bridge dataset config of a packed run (data.packing=<capacity>): declarative, so it serializes into the
    run's Bridge config like Bridge's own. `seq_length` is the capacity (Bridge's model.seq_length is set to it:
    CUDA graphs and pipeline buffers are capacity x 1)."""

    seq_length: int
    source: HFDatasetSourceConfig
    hf_processor_path: str
    bins_file: str
    """JSON written by prepare_bins: the bins (sample indices in Bridge's example order)."""
    static: bool = False
    """Pad every row to seq_length (static shapes)."""
    pack_align: int = 1
    """Each sample's segment in the row is padded to a multiple of this (CP/SP, quantized GEMMs)."""
    skip_getting_attention_mask_from_dataset: bool = True
    dataloader_type: str | None = "cyclic"
    validation_source: HFDatasetSourceConfig | None = None
    """The held-out samples (data.validation, data.validation_fraction), binned into validation_bins_file."""
    validation_bins_file: str | None = None

    def build_datasets(self, context: DatasetBuildContext) -> tuple[BinDataset | None, BinDataset | None, None]:
        processor = load_processor(self.hf_processor_path)
        train = self._split(self.source, self.bins_file, context.train_samples, processor)
        valid = self._split(self.validation_source, self.validation_bins_file, context.valid_samples, processor) \
            if self.validation_source is not None and self.validation_bins_file else None
        return train, valid, None

    def _split(self, source: HFDatasetSourceConfig, bins_file: str, length: int, processor: Any) -> BinDataset | None:
        """The dataset of one split's bins (None when Bridge asks for no samples of it)."""
        if length <= 0:
            return None
        bins = Bins.load(bins_file)
        if bins.capacity != self.seq_length:
            raise ValueError(f"{bins_file} holds bins of {bins.capacity} tokens, not {self.seq_length}")
        examples = bridge_examples(source)
        if len(examples) != len(bins.lengths):
            raise ValueError(f"{bins_file} bins {len(bins.lengths)} samples but the source now has "
                             f"{len(examples)}: rerun so vlmtrain.data.prepare bins the data again")
        return BinDataset(examples, bins.bins, length, processor, self.seq_length, self.static, self.pack_align)
