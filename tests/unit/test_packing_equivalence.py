"""data.packing=true changes no sample's training inputs, exactly, on CPU.

Real `data=realistic` micro-batches go through vlmtrain's run (Hydra compose, data preparation, the finalized
ConfigContainer) into Bridge's DirectSFTDataset and the Qwen collate it binds, packed at each alignment multiple
Bridge sets for a real layout (1, 8, 128), and through vlm_step's batch handling; the MRoPE positions are Bridge's
get_rope_index called as Qwen3VLModel.forward calls it. Every sample's slice of the packed row must equal that
sample collated alone (packing off, MBS 1). Megatron Bridge has had packed Qwen3-VL RoPE bugs (issue #1776,
PR #4532), so the controls show that positions computed without the per-sample boundaries do differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from vlmtrain.build import container, target
from vlmtrain.check import preflight

RUN = ("data=realistic", "data.payload.num_samples=12", "data.payload.images_per_sample=[0.4,0.2,0.2,0.2]",
       "data.num_workers=0", "train.global_batch_size=8")
"""12 real samples holding 0-3 images each (the default mix has no text-only samples)."""

ALONE = ("gpus_per_node=1", "train.micro_batch_size=1")
"""Packing off, one sample per micro-batch: padded to a multiple of 128 tokens, as vlmtrain configures it."""

PACKED = {
    1: ("gpus_per_node=1",),
    8: ("parallelism=3d", "parallelism.cp=4", "gpus_per_node=4"),
    128: ("parallelism=3d", "parallelism.cp=64", "nodes=8", "gpus_per_node=8"),
}
"""Alignment multiple of each packed sample -> a layout for which Bridge sets it (2 x CP)."""

MICRO_BATCHES = {
    "images_around_text": (2, 0, 1, 3),
    "text_first": (0, 1, 0, 2),
    "text_only": (0, 0, 0, 0),
}
"""Image count of each sample of a micro-batch, in order."""


@dataclass
class Data:
    """A finalized run's dataset as Bridge's training holds it: its examples and bound collate."""

    cfg: Any
    dataset: Any


@pytest.fixture(scope="module")
def data(compose: Callable[..., Any], bridge: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Data]:
    """data(*overrides): the run's Data, built once per overrides. Its own cache dir: the shared one holds one
    realistic dataset at a time, and this is not the default mix."""
    from megatron.bridge.data.utils import get_dataset_provider

    cache = tmp_path_factory.mktemp("packing_equivalence")
    built: dict[tuple[str, ...], Data] = {}

    def _data(*overrides: str) -> Data:
        if overrides not in built:
            run = compose(*RUN, f"data.cache_dir={cache}", *overrides, output_dir=str(cache / "run"))
            assert not preflight.errors(preflight.check(run))
            cfg = container.build(run)
            target.finalize(run, cfg)  # Bridge sets the packed alignment multiple here
            train, _, _ = get_dataset_provider(cfg.dataset)([run.data.payload.num_samples, 0, 0], cfg.dataset)
            built[overrides] = Data(cfg, train)
        return built[overrides]

    return _data


def _image_count(example: dict[str, Any]) -> int:
    return sum(part.get("type") == "image" for turn in example["conversation"]
               if isinstance(turn["content"], list) for part in turn["content"])


def _pick(dataset: Any, counts: tuple[int, ...]) -> list[int]:
    """Distinct sample indices with these image counts, in order."""
    picked: list[int] = []
    for count in counts:
        free = [i for i in range(len(dataset)) if _image_count(dataset[i]) == count and i not in picked]
        assert free, f"the generated dataset has too few {count}-image samples for {counts}: change RUN's weights"
        picked.append(free[0])
    return picked


def _step_batch(batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """What vlm_step.forward_step hands Qwen3VLModel: its batch and PackedSeqParams."""
    from megatron.bridge.training import vlm_step
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "cuda", lambda self, *_a, **_k: self)  # no GPU here: the copies stay on host
        step = vlm_step.get_batch_from_iterator(iter([batch]), is_first_pp_stage=True, is_last_pp_stage=True)
    packed = {key: step[key] for key in vlm_step._PACKED_SEQ_PARAM_KEYS if step.get(key) is not None}  # get_batch
    return step, get_packed_seq_params(packed)


def _positions(cfg: Any, input_ids: torch.Tensor, visual: Any, packed_seq_params: Any) -> torch.Tensor:
    """MRoPE position ids [3, 1, T], computed as Qwen3VLModel.forward computes them (it drops the collate's 1-D
    position_ids; a [1, T] row is not `legacy_packed_bshd`, so it passes packed_seq_params on)."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope import get_rope_index

    grids = visual.normalized_for_model() if visual is not None else {}
    model = cfg.model
    positions, _ = get_rope_index(model.spatial_merge_size, model.image_token_id, model.video_token_id,
                                  model.vision_start_token_id, input_ids, image_grid_thw=grids.get("image_grid_thw"),
                                  video_grid_thw=grids.get("video_grid_thw"), attention_mask=None,
                                  packed_seq_params=packed_seq_params)
    return positions


@dataclass
class Alone:
    """One sample collated alone (packing off, MBS 1), cut to its real tokens; positions as the model computes
    them for that row (qwen3_vl_step passes no packed params and no position ids)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    positions: torch.Tensor
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None


def _alone(data: Data, index: int) -> Alone:
    batch = data.dataset.collate_fn([data.dataset[index]])
    n = int(batch["attention_mask"].sum())
    assert batch["attention_mask"][0, :n].all()  # right padded: the real tokens come first
    visual = batch["visual_inputs"]
    positions = _positions(data.cfg, batch["input_ids"], visual, None)
    return Alone(batch["input_ids"][0, :n], batch["labels"][0, :n], batch["loss_mask"][0, :n], positions[:, 0, :n],
                 visual.pixel_values, visual.image_grid_thw)


@dataclass
class Case:
    """One packed micro-batch and its samples collated alone."""

    step: dict[str, Any]
    packed_seq_params: Any
    alone: list[Alone]
    cfg: Any

    def slices(self) -> list[tuple[int, int, int]]:
        """(start, real end, padded end) of each sample in the row, from the packed params (padded when Bridge
        aligns the samples)."""
        from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_q_cu_seqlens

        cu, cu_padded = (c.tolist() for c in get_packed_seq_q_cu_seqlens(self.packed_seq_params))
        return [(cu_padded[i], cu_padded[i] + cu[i + 1] - cu[i], cu_padded[i + 1]) for i in range(len(cu) - 1)]

    def positions(self, packed_seq_params: Any) -> torch.Tensor:
        return _positions(self.cfg, self.step["input_ids"], self.step["visual_inputs"], packed_seq_params)


@pytest.fixture(scope="module")
def case(data: Callable[..., Data]) -> Callable[..., Case]:
    """case(multiple, micro-batch name), collated once for the module."""
    alone_cache: dict[int, Alone] = {}
    cases: dict[tuple[int, str], Case] = {}

    def _case(multiple: int, name: str) -> Case:
        if (multiple, name) in cases:
            return cases[multiple, name]
        packed_data, alone_data = data("data.packing=true", "train.micro_batch_size=4", *PACKED[multiple]), data(*ALONE)
        assert packed_data.cfg.dataset.in_batch_packing_pad_to_multiple_of == multiple
        assert not alone_data.cfg.dataset.enable_in_batch_packing and alone_data.cfg.dataset.pad_to_multiple_of == 128
        indices = _pick(packed_data.dataset, MICRO_BATCHES[name])
        packed = packed_data.dataset.collate_fn([packed_data.dataset[i] for i in indices])
        step, params = _step_batch(packed)
        for i in indices:
            if i not in alone_cache:
                alone_cache[i] = _alone(alone_data, i)
        cases[multiple, name] = Case(step, params, [alone_cache[i] for i in indices], packed_data.cfg)
        return cases[multiple, name]

    return _case


def _cat(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    present = [p for p in parts if p is not None]
    return torch.cat(present) if present else None


def test_collate_is_bridges_qwen_collate(data: Callable[..., Data]) -> None:
    """The collate under test is the one Bridge's registry resolves for vlmtrain's processor."""
    from megatron.bridge.data.collators.registry import resolve_model_collate
    from megatron.bridge.models.qwen_vl.data.collate_fn import qwen2_5_collate_fn
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(data(*ALONE).cfg.dataset.hf_processor_path, local_files_only=True)
    assert resolve_model_collate(type(processor).__name__) is qwen2_5_collate_fn


@pytest.mark.parametrize("name", sorted(MICRO_BATCHES))
@pytest.mark.parametrize("multiple", sorted(PACKED))
def test_packed_sample_equals_sample_alone(case: Callable[..., Case], multiple: int, name: str) -> None:
    from megatron.bridge.data.datasets.utils import IGNORE_INDEX
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model import _is_mrope_position_ids

    c = case(multiple, name)
    row = c.step["input_ids"]
    # One [1, T] THD row whose 1-D position ids the model replaces with MRoPE computed from the packed params.
    assert row.shape[0] == 1 and not _is_mrope_position_ids(c.step["position_ids"])
    slices = c.slices()
    assert len(slices) == len(c.alone) and slices[0][0] == 0 and slices[-1][2] == row.shape[1]
    positions = c.positions(c.packed_seq_params)
    assert positions.shape == (3, 1, row.shape[1])

    for i, ((start, end, padded_end), alone) in enumerate(zip(slices, c.alone, strict=True)):
        assert end - start == alone.input_ids.numel(), f"sample {i}: length"
        assert padded_end - start == -(-(end - start) // multiple) * multiple, f"sample {i}: not aligned"
        assert torch.equal(row[0, start:end], alone.input_ids), f"sample {i}: input_ids"
        assert torch.equal(c.step["labels"][0, start:end], alone.labels), f"sample {i}: labels"
        assert torch.equal(c.step["loss_mask"][0, start:end], alone.loss_mask), f"sample {i}: loss_mask"
        assert torch.equal(positions[:, 0, start:end], alone.positions), f"sample {i}: MRoPE positions"
        # No label crosses into the next sample; the alignment padding carries no loss.
        assert c.step["labels"][0, end - 1] == IGNORE_INDEX and c.step["loss_mask"][0, end - 1] == 0
        assert (c.step["labels"][0, end:padded_end] == IGNORE_INDEX).all(), f"sample {i}: padding labels"
        assert (c.step["loss_mask"][0, end:padded_end] == 0).all(), f"sample {i}: padding loss_mask"

    padding = sum(padded_end - end for _, end, padded_end in slices)
    assert (padding > 0) == (multiple > 1)
    assert int(c.step["loss_mask"].sum()) == sum(int(a.loss_mask.sum()) for a in c.alone) > 0
    assert int((c.step["labels"] != IGNORE_INDEX).sum()) == sum(int((a.labels != IGNORE_INDEX).sum()) for a in c.alone)

    visual = c.step["visual_inputs"]
    for field in ("pixel_values", "image_grid_thw"):
        expected = _cat([getattr(a, field) for a in c.alone])
        got = getattr(visual, field)
        assert (got is None) == (expected is None) == (name == "text_only"), field
        assert got is None or torch.equal(got, expected), field


@pytest.mark.parametrize("multiple", sorted(PACKED))
def test_positions_without_sample_boundaries_differ(case: Callable[..., Case], multiple: int) -> None:
    """Negative controls (the GPU check uses the same): MRoPE over the whole row as one sequence, or with a single
    boundary cu_seqlens = [0, T], matches the first sample only."""
    from megatron.core.packed_seq_params import PackedSeqParams

    c = case(multiple, "images_around_text")
    total = c.step["input_ids"].shape[1]
    whole_row = torch.tensor([0, total], dtype=torch.int32)
    controls = {
        "no cu_seqlens": c.positions(None),
        "cu_seqlens [0, T]": c.positions(PackedSeqParams(qkv_format="thd", cu_seqlens_q=whole_row,
                                                         cu_seqlens_kv=whole_row, max_seqlen_q=total,
                                                         max_seqlen_kv=total)),
    }
    for label, positions in controls.items():
        for i, ((start, end, _), alone) in enumerate(zip(c.slices(), c.alone, strict=True)):
            same = torch.equal(positions[:, 0, start:end], alone.positions)
            assert same == (i == 0), f"{label}: sample {i}"
