"""The packed micro-batches of tests/unit/test_bins_dataset.py and test_packing_harness.py, built on CPU.

Real `data=realistic` samples go through vlmtrain's run (Hydra compose, the data stage's bins, the finalized
ConfigContainer) into the Bridge dataset the run trains on (PackedBinsDatasetConfig -> BinDataset, built by
Bridge's dataset provider) and its collate (Bridge's Qwen collate with enable_in_batch_packing and the run's
Resolved.pack_align), for real layouts whose pack_align is 1, 2 (TP 2 under SP), 8 (CP 4), 16 (FP8), 32 (MXFP8)
and 128 (CP 64), dynamic and static (data.packing_static: the row padded to the capacity), and through vlm_step's
batch handling; the MRoPE positions are Bridge's get_rope_index called as Qwen3VLModel.forward calls it. Each
packed micro-batch comes with its samples collated alone (packing off, MBS 1, as vlmtrain trains unpacked data).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from vlmtrain.build import container, target
from vlmtrain.check import preflight
from vlmtrain.config.resolve import resolve

CAPACITY = 8192
"""Tokens per packed row: holds every micro-batch below with room for a static tail; a multiple of each pack_align."""

RUN = ("data=realistic", "data.payload.num_samples=12", "data.payload.images_per_sample=[0.4,0.2,0.2,0.2]",
       "data.num_workers=0", "train.global_batch_size=8", "train.micro_batch_size=1")
"""12 real samples holding 0-3 images each (the default mix has no text-only samples)."""

ALONE = ("gpus_per_node=1",)
"""Packing off, one sample per micro-batch: padded to a multiple of 128 tokens, as vlmtrain configures it."""

PACKED = {
    1: ("gpus_per_node=1",),
    2: ("parallelism=3d", "parallelism.tp=2", "gpus_per_node=2"),
    8: ("parallelism=3d", "parallelism.cp=4", "gpus_per_node=4"),
    16: ("gpus_per_node=1", "precision=fp8"),
    32: ("gpus_per_node=1", "precision=mxfp8", "hardware=b200"),
    128: ("parallelism=3d", "parallelism.cp=64", "nodes=8", "gpus_per_node=8"),
}
"""Resolved.pack_align -> a layout preflight accepts that yields it (2 x CP, TP under SP, the GEMMs' token multiple)."""

STATIC = (1, 16)
"""Multiples also run with data.packing_static=true: without and with per-sample alignment padding."""

MICRO_BATCHES = {
    "images_around_text": (2, 0, 1, 3),
    "text_first": (0, 1, 0, 2),
    "text_only": (0, 0, 0, 0),
}
"""Image count of each sample of a micro-batch (one bin), in order."""


@dataclass
class Data:
    """A composed run, its finalized Bridge config and the train dataset Bridge's provider builds from it."""

    run: Any
    cfg: Any
    dataset: Any


def data_builder(compose: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Data]:
    """The test modules' `data` fixture: data(*overrides), the run's Data, built once per overrides. Its own cache
    dir: the shared one holds one realistic dataset at a time, and this is not the default mix."""
    from megatron.bridge.data.utils import get_dataset_provider

    cache = tmp_path_factory.mktemp("packing_equivalence")
    built: dict[tuple[str, ...], Data] = {}

    def _data(*overrides: str) -> Data:
        if overrides not in built:
            run = compose(*RUN, f"data.cache_dir={cache}", *overrides, output_dir=str(cache / "run"))
            assert not preflight.errors(preflight.check(run, resolve(run)))
            cfg = container.build(run, resolve(run))
            target.finalize(run, resolve(run), cfg)  # Bridge's own validation, as the run does
            train, _, _ = get_dataset_provider(cfg.dataset)([run.data.payload.num_samples, 0, 0], cfg.dataset)
            built[overrides] = Data(run, cfg, train)
        return built[overrides]

    return _data


def _packed_data(data: Callable[..., Data], multiple: int, static: bool) -> Data:
    """The packed run at the layout whose pack_align is `multiple`; checks the multiple reaches its collate."""
    from vlmtrain.data.bins_dataset import BinDataset, PackedBinsDatasetConfig

    overrides = (f"data.packing={CAPACITY}", *PACKED[multiple], *(("data.packing_static=true",) if static else ()))
    d = data(*overrides)
    ds = d.cfg.dataset
    assert resolve(d.run).pack_align == multiple
    assert isinstance(ds, PackedBinsDatasetConfig) and isinstance(d.dataset, BinDataset)
    assert d.cfg.train.micro_batch_size == 1 and ds.seq_length == d.dataset.capacity == CAPACITY
    assert ds.pack_align == d.dataset.align == multiple and ds.static == d.dataset.static == static
    return d


def _image_count(example: dict[str, Any]) -> int:
    return sum(part.get("type") == "image" for turn in example["conversation"]
               if isinstance(turn["content"], list) for part in turn["content"])


def _pick(examples: list[dict[str, Any]], counts: tuple[int, ...]) -> list[int]:
    """Distinct sample indices with these image counts, in order."""
    picked: list[int] = []
    for count in counts:
        free = [i for i in range(len(examples)) if _image_count(examples[i]) == count and i not in picked]
        assert free, f"the generated dataset has too few {count}-image samples for {counts}: change RUN's weights"
        picked.append(free[0])
    return picked


def _one_bin(d: Data, indices: list[int]) -> dict[str, Any]:
    """The micro-batch of a bin holding `indices`: the run's BinDataset with its own examples, processor and
    config fields, holding that one bin (the run's greedy bins follow data order, not a chosen mix)."""
    from vlmtrain.data.bins_dataset import BinDataset

    run, ds = d.dataset, d.cfg.dataset
    one = BinDataset(run.examples, [indices], 1, run.processor, ds.seq_length, ds.static, ds.pack_align)
    assert one[0] == [run.examples[i] for i in indices]
    return one.collate_fn([one[0]])


def step_batch(batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """What vlm_step.forward_step hands Qwen3VLModel: its batch and PackedSeqParams."""
    from megatron.bridge.training import vlm_step
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "cuda", lambda self, *_a, **_k: self)  # no GPU here: the copies stay on host
        step = vlm_step.get_batch_from_iterator(iter([batch]), is_first_pp_stage=True, is_last_pp_stage=True)
    packed = {key: step[key] for key in vlm_step._PACKED_SEQ_PARAM_KEYS if step.get(key) is not None}  # get_batch
    return step, get_packed_seq_params(packed)


Rope = Callable[[torch.Tensor, Any, Any], torch.Tensor]
"""(input_ids, image_grid_thw, packed_seq_params) -> MRoPE positions [3, 1, T]: the GPU check's `rope`."""


def _rope(cfg: Any) -> Rope:
    """Bridge's get_rope_index bound to the model's token ids, as Qwen3VLModel.forward calls it (no attention mask;
    a [1, T] row is not `legacy_packed_bshd`, so the packed params are passed on)."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope import get_rope_index

    m = cfg.model

    def rope(input_ids: torch.Tensor, grid: Any, packed_seq_params: Any) -> torch.Tensor:
        return get_rope_index(m.spatial_merge_size, m.image_token_id, m.video_token_id, m.vision_start_token_id,
                              input_ids, image_grid_thw=grid, attention_mask=None,
                              packed_seq_params=packed_seq_params)[0]

    return rope


def _grid(visual: Any) -> torch.Tensor | None:
    """The image grid the model reads from the batch's visual inputs (none for text only)."""
    return visual.normalized_for_model().get("image_grid_thw") if visual is not None else None


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
    positions = _rope(data.cfg)(batch["input_ids"], _grid(visual), None)
    return Alone(batch["input_ids"][0, :n], batch["labels"][0, :n], batch["loss_mask"][0, :n], positions[:, 0, :n],
                 visual.pixel_values, visual.image_grid_thw)


@dataclass
class PackedBatch:
    """One packed micro-batch (the collate's batch, and vlm_step's) and its samples collated alone."""

    batch: dict[str, Any]
    step: dict[str, Any]
    packed_seq_params: Any
    alone: list[Alone]
    rope: Rope

    def slices(self) -> list[tuple[int, int, int]]:
        """(start, real end, padded end) of each sample in the row, from the packed params (padded when the
        samples are aligned or the row is static)."""
        from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_q_cu_seqlens

        cu, cu_padded = (c.tolist() for c in get_packed_seq_q_cu_seqlens(self.packed_seq_params))
        return [(cu_padded[i], cu_padded[i] + cu[i + 1] - cu[i], cu_padded[i + 1]) for i in range(len(cu) - 1)]

    def positions(self, packed_seq_params: Any) -> torch.Tensor:
        return self.rope(self.step["input_ids"], _grid(self.step["visual_inputs"]), packed_seq_params)


def case_builder(data: Callable[..., Data]) -> Callable[..., PackedBatch]:
    """The test modules' `case` fixture: case(multiple, micro-batch name, static), collated once per module."""
    alone_cache: dict[int, Alone] = {}
    cases: dict[tuple[int, str, bool], PackedBatch] = {}

    def _case(multiple: int, name: str, static: bool = False) -> PackedBatch:
        if (multiple, name, static) in cases:
            return cases[multiple, name, static]
        packed_data, alone_data = _packed_data(data, multiple, static), data(*ALONE)
        assert not alone_data.cfg.dataset.enable_in_batch_packing and alone_data.cfg.dataset.pad_to_multiple_of == 128
        examples = packed_data.dataset.examples
        indices = _pick(examples, MICRO_BATCHES[name])
        batch = _one_bin(packed_data, indices)
        step, params = step_batch(batch)
        for i in indices:
            assert alone_data.dataset[i] == examples[i]  # the unpacked run reads the same examples in the same order
            if i not in alone_cache:
                alone_cache[i] = _alone(alone_data, i)
        cases[multiple, name, static] = PackedBatch(batch, step, params, [alone_cache[i] for i in indices],
                                             _rope(packed_data.cfg))
        return cases[multiple, name, static]

    return _case
