"""data.packing=<capacity> changes no sample's training inputs, exactly, on CPU.

Real `data=realistic` samples go through vlmtrain's run (Hydra compose, the data stage's bins, the finalized
ConfigContainer) into the Bridge dataset the run trains on (PackedBinsDatasetConfig -> BinDataset, built by
Bridge's dataset provider) and its collate (Bridge's Qwen collate with enable_in_batch_packing and the run's
Resolved.pack_align), for real layouts whose pack_align is 1, 2 (TP 2 under SP), 8 (CP 4), 16 (FP8), 32 (MXFP8)
and 128 (CP 64), dynamic and static (data.packing_static: the row padded to the capacity), and through vlm_step's
batch handling; the MRoPE positions are Bridge's get_rope_index called as Qwen3VLModel.forward calls it. Every
sample's slice of the packed row must equal that sample collated alone (packing off, MBS 1, as vlmtrain trains
unpacked data). Megatron Bridge has had packed Qwen3-VL RoPE bugs (issue #1776, PR #4532), so the controls show
that positions computed without the per-sample boundaries do differ, that whole-row positions are a pure shift per
sample (RoPE attention, relative, cancels it while the boundaries are kept: why the GPU check's position control
permutes positions instead), and that the GPU check's own controls (lab.checks.packing_harness.control_batch)
break what they claim to.
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
from vlmtrain.lab.checks.packing_harness import control_batch

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
            assert not preflight.errors(preflight.check(run, resolve(run)))
            cfg = container.build(run, resolve(run))
            target.finalize(run, cfg)  # Bridge's own validation, as the run does
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


def _step_batch(batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
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


@pytest.fixture(scope="module")
def case(data: Callable[..., Data]) -> Callable[..., PackedBatch]:
    """case(multiple, micro-batch name, static), collated once for the module."""
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
        step, params = _step_batch(batch)
        for i in indices:
            assert alone_data.dataset[i] == examples[i]  # the unpacked run reads the same examples in the same order
            if i not in alone_cache:
                alone_cache[i] = _alone(alone_data, i)
        cases[multiple, name, static] = PackedBatch(batch, step, params, [alone_cache[i] for i in indices],
                                             _rope(packed_data.cfg))
        return cases[multiple, name, static]

    return _case


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
    _, one_sequence = _step_batch(broken)
    for i, ((start, end, _), alone) in enumerate(zip(slices, c.alone, strict=True)):
        same = torch.equal(c.positions(one_sequence)[:, 0, start:end], alone.positions)
        assert same == (i == 0), f"cu_seqlens [0, T]: sample {i}"
