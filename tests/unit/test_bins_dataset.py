"""data.packing=<capacity> changes no sample's training inputs, exactly, on CPU: vlmtrain.data.bins_dataset
(BinDataset and its PackedBinsDatasetConfig) through the run's whole path into Bridge's collate and vlm_step (built
in tests/unit/packed_batches.py). Every sample's slice of the packed row must equal that sample collated alone
(packing off, MBS 1, as vlmtrain trains unpacked data), dynamic and static rows alike. The controls that show
packed positions can go wrong are in test_packing_harness.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from packed_batches import ALONE, CAPACITY, MICRO_BATCHES, PACKED, STATIC, Data, PackedBatch, case_builder, data_builder


@pytest.fixture(scope="module")
def data(compose: Callable[..., Any], bridge: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Data]:
    return data_builder(compose, tmp_path_factory)


@pytest.fixture(scope="module")
def case(data: Callable[..., Data]) -> Callable[..., PackedBatch]:
    return case_builder(data)


def _cat(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    present = [p for p in parts if p is not None]
    return torch.cat(present) if present else None


def _assert_samples_equal_alone(c: PackedBatch, multiple: int, name: str, static: bool) -> None:
    """Every sample's slice of the row is the sample alone; padding (alignment, static tail) carries no loss."""
    from megatron.bridge.data.datasets.utils import IGNORE_INDEX
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model import _is_mrope_position_ids

    row = c.step["input_ids"]
    # One [1, T] THD row whose 1-D position ids the model replaces with MRoPE computed from the packed params.
    assert row.shape[0] == 1 and not _is_mrope_position_ids(c.step["position_ids"])
    assert (row.shape[1] == CAPACITY) if static else (row.shape[1] < CAPACITY)
    slices = c.slices()
    assert len(slices) == len(c.alone) and slices[0][0] == 0 and slices[-1][2] == row.shape[1]
    positions = c.positions(c.packed_seq_params)
    assert positions.shape == (3, 1, row.shape[1])

    for i, ((start, end, padded_end), alone) in enumerate(zip(slices, c.alone, strict=True)):
        assert end - start == alone.input_ids.numel(), f"sample {i}: length"
        if not (static and i == len(slices) - 1):  # a static row's last segment runs to the capacity
            assert padded_end - start == -(-(end - start) // multiple) * multiple, f"sample {i}: not aligned"
        assert torch.equal(row[0, start:end], alone.input_ids), f"sample {i}: input_ids"
        assert torch.equal(c.step["labels"][0, start:end], alone.labels), f"sample {i}: labels"
        assert torch.equal(c.step["loss_mask"][0, start:end], alone.loss_mask), f"sample {i}: loss_mask"
        assert torch.equal(positions[:, 0, start:end], alone.positions), f"sample {i}: MRoPE positions"
        # No label crosses into the next sample; the padding carries no loss.
        assert c.step["labels"][0, end - 1] == IGNORE_INDEX and c.step["loss_mask"][0, end - 1] == 0
        assert (c.step["labels"][0, end:padded_end] == IGNORE_INDEX).all(), f"sample {i}: padding labels"
        assert (c.step["loss_mask"][0, end:padded_end] == 0).all(), f"sample {i}: padding loss_mask"

    padding = sum(padded_end - end for _, end, padded_end in slices)
    assert (padding > 0) == (multiple > 1 or static)
    assert int(c.step["loss_mask"].sum()) == sum(int(a.loss_mask.sum()) for a in c.alone) > 0
    assert int((c.step["labels"] != IGNORE_INDEX).sum()) == sum(int((a.labels != IGNORE_INDEX).sum()) for a in c.alone)

    visual = c.step["visual_inputs"]
    for field in ("pixel_values", "image_grid_thw"):
        expected = _cat([getattr(a, field) for a in c.alone])
        got = getattr(visual, field)
        assert (got is None) == (expected is None) == (name == "text_only"), field
        assert got is None or torch.equal(got, expected), field


def test_collate_is_bridges_qwen_collate(data: Callable[..., Data]) -> None:
    """The unpacked collate is the one Bridge's registry resolves for vlmtrain's processor."""
    from megatron.bridge.data.collators.registry import resolve_model_collate
    from megatron.bridge.models.qwen_vl.data.collate_fn import qwen2_5_collate_fn
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(data(*ALONE).cfg.dataset.hf_processor_path, local_files_only=True)
    assert resolve_model_collate(type(processor).__name__) is qwen2_5_collate_fn


@pytest.mark.parametrize("name", sorted(MICRO_BATCHES))
@pytest.mark.parametrize("multiple", sorted(PACKED))
def test_packed_sample_equals_sample_alone(case: Callable[..., PackedBatch], multiple: int, name: str) -> None:
    _assert_samples_equal_alone(case(multiple, name), multiple, name, static=False)


def _real_tokens(c: PackedBatch) -> torch.Tensor:
    """[T] bool: the row's tokens that belong to a sample (not alignment or static padding)."""
    real = torch.zeros(c.step["input_ids"].shape[1], dtype=torch.bool)
    for start, end, _ in c.slices():
        real[start:end] = True
    return real


@pytest.mark.parametrize("name", sorted(MICRO_BATCHES))
@pytest.mark.parametrize("multiple", STATIC)
def test_static_row_pads_one_tail_and_keeps_every_sample(case: Callable[..., PackedBatch], multiple: int,
                                                          name: str) -> None:
    """data.packing_static=true: the row is the capacity; each sample's slice and positions are the dynamic row's
    (and so the sample alone's); the only addition is one span at the end, no labels and no loss."""
    from megatron.bridge.data.datasets.utils import IGNORE_INDEX

    c, dyn = case(multiple, name, static=True), case(multiple, name)
    _assert_samples_equal_alone(c, multiple, name, static=True)
    n = dyn.step["input_ids"].shape[1]
    assert c.slices()[:-1] == dyn.slices()[:-1] and c.slices()[-1][:2] == dyn.slices()[-1][:2]
    for key in ("input_ids", "labels", "loss_mask"):
        assert torch.equal(c.step[key][:, :n], dyn.step[key]), key
    tail = slice(n, CAPACITY)
    assert (c.step["input_ids"][0, tail] == 0).all() and (c.step["labels"][0, tail] == IGNORE_INDEX).all()
    assert (c.step["loss_mask"][0, tail] == 0).all()
    # The real tokens are the dynamic row's; all else is its alignment padding plus exactly [n, capacity).
    real, dyn_real = _real_tokens(c), _real_tokens(dyn)
    assert torch.equal(real[:n], dyn_real) and not real[n:].any()
    positions, dyn_positions = c.positions(c.packed_seq_params), dyn.positions(dyn.packed_seq_params)
    assert torch.equal(positions[:, 0, real], dyn_positions[:, 0, dyn_real])
