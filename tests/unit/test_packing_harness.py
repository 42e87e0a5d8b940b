"""Negative controls for packed MRoPE positions on CPU, with vlmtrain.lab.checks.packing_harness.control_batch
(the GPU check's controls) on the packed micro-batches of tests/unit/packed_batches.py. Megatron Bridge has had
packed Qwen3-VL RoPE bugs (issue #1776, PR #4532), so the controls show that positions computed without the
per-sample boundaries do differ, that whole-row positions are a pure shift per sample (RoPE attention, relative,
cancels it while the boundaries are kept: why the GPU check's position control permutes positions instead), and
that the GPU check's own controls break what they claim to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from packed_batches import MICRO_BATCHES, PACKED, Data, PackedBatch, case_builder, data_builder, step_batch

from vlmtrain.lab.checks.packing_harness import control_batch


@pytest.fixture(scope="module")
def data(compose: Callable[..., Any], bridge: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Data]:
    return data_builder(compose, tmp_path_factory)


@pytest.fixture(scope="module")
def case(data: Callable[..., Data]) -> Callable[..., PackedBatch]:
    return case_builder(data)


@pytest.mark.parametrize("name", sorted(MICRO_BATCHES))
@pytest.mark.parametrize("multiple", sorted(PACKED))
def test_positions_without_sample_boundaries_differ(case: Callable[..., PackedBatch], multiple: int, name: str) -> None:
    """Negative controls. Whole-row positions (get_rope_index without cu_seqlens, the GPU check's
    `whole_row_positions`) shift every position of a later sample by one constant, so they differ from the second
    sample on by a pure shift; the GPU check's `positions` control permutes each sample's positions (differs for
    every sample, same set); its `boundaries` control runs the row as one sequence, cu_seqlens [0, T], whose
    positions match the first sample only."""
    c = case(multiple, name)
    total = c.batch["input_ids"].shape[1]
    slices = c.slices()

    whole_row = control_batch(c.batch, "whole_row_positions", c.rope)["position_ids"]
    assert torch.equal(whole_row, c.positions(None))
    for i, ((start, end, _), alone) in enumerate(zip(slices, c.alone, strict=True)):
        shift = whole_row[:, 0, start:end] - alone.positions
        assert (shift == shift[0, 0]).all(), f"sample {i}: whole-row positions are not a pure shift"
        assert (int(shift[0, 0]) == 0) == (i == 0), f"sample {i}: shift {int(shift[0, 0])}"

    permuted = control_batch(c.batch, "positions", c.rope)
    for key in ("cu_seqlens_q", "cu_seqlens_kv"):
        assert torch.equal(permuted[key], c.batch[key]), f"positions control: {key} kept"
    for i, ((start, end, _), alone) in enumerate(zip(slices, c.alone, strict=True)):
        got = permuted["position_ids"][:, 0, start:end]
        assert not torch.equal(got, alone.positions), f"positions control: sample {i} unchanged"
        assert sorted(map(tuple, got.T.tolist())) == sorted(map(tuple, alone.positions.T.tolist())), \
            f"positions control: sample {i} is not a permutation of its positions"

    broken = control_batch(c.batch, "boundaries", c.rope)
    assert broken["cu_seqlens_q"].tolist() == broken["cu_seqlens_kv"].tolist() == [0, total]
    assert "cu_seqlens_q_padded" not in broken and int(broken["max_seqlen_q"]) == total
    assert torch.equal(broken["position_ids"], c.positions(c.packed_seq_params))  # per-sample positions kept
    _, one_sequence = step_batch(broken)
    for i, ((start, end, _), alone) in enumerate(zip(slices, c.alone, strict=True)):
        same = torch.equal(c.positions(one_sequence)[:, 0, start:end], alone.positions)
        assert same == (i == 0), f"cu_seqlens [0, T]: sample {i}"


def test_static_row_is_fitted_to_the_compared_rows(data: Callable[..., Data]) -> None:
    """The GPU check's datasets: its static row is padded past the longest compared row by STATIC_SLACK at least,
    to a multiple of it, and no longer (a fixed long row's logits did not fit at H2's shapes on 80 GB)."""
    from packed_batches import ALONE

    from vlmtrain.lab.checks.packing_harness import STATIC_SLACK, datasets, pick_rows

    rows = ((0, 1), (2, 0))
    alone, packed = datasets(data(*ALONE).cfg.dataset, rows)
    exs = alone._base_examples
    lengths = [packed[""].collate_fn([[exs[i] for i in r]])["input_ids"].shape[1] for r in pick_rows(exs, rows)]
    static = packed["_static"].collate_fn([[exs[i] for i in pick_rows(exs, rows)[0]]])["input_ids"].shape[1]
    assert static % STATIC_SLACK == 0 and max(lengths) + STATIC_SLACK <= static < max(lengths) + 2 * STATIC_SLACK
