"""Which prepared samples each micro-batch holds, carried through Bridge's collate (samples.jsonl, failure records).

The checked copy the scan writes (vlmtrain.data.jsonl: data=sample, realistic, jsonl) gives every row
`sample_index`, its row number there: stable across runs and resumes, since Megatron's sampler hands out dataset
indices and Bridge's DirectSFTDataset maps index i to row i % rows. Bridge keeps extra columns as example metadata,
and `with_sample_ids` wraps a dataset's collate so the collated batch carries its examples' indices under
`sample_ids` (host ints, built in the loader worker: no GPU work). A packed run's dataset (vlmtrain.data.bins)
reads the same examples and puts its bin's ids there itself (`ids`). Other kinds carry none (None per sample).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

KEY = "sample_index"
BATCH_KEY = "sample_ids"


def ids(examples: list[dict[str, Any]]) -> list[int | None]:
    """Each example's `sample_index` (None where the source has none), in order."""
    return [ex.get(KEY) for ex in examples]


def with_sample_ids(collate: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """`collate`, whose batch also holds `sample_ids`: each example's `sample_index`, in batch order."""

    def collate_with_ids(examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = collate(examples)
        batch[BATCH_KEY] = ids(examples)
        return batch

    return collate_with_ids
