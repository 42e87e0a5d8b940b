"""Sample ids on the real data path: the checked copy's `sample_index` -> Bridge's DirectSFTDataset and Qwen collate
(with vlmtrain's id hook installed) or, packed (data.packing=<capacity>), vlmtrain's BinDataset, whose collate puts
its bin's ids on the row itself -> Bridge's loader and Megatron's cyclic sampler -> the step counters' iterator,
which takes the ids off each batch. They must be exactly the samples the sampler hands out for consumed_samples,
per data-parallel rank, also when the loader starts at consumed_samples = k (how Bridge restores the data position
on resume), padded and packed."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vlmtrain.build import container
from vlmtrain.config.resolve import resolve
from vlmtrain.data import prepare
from vlmtrain.data.sample_ids import BATCH_KEY, KEY
from vlmtrain.train import bridge_patches
from vlmtrain.train.step_counters import StepCounters

DP = 2
CAPACITY = 1024
"""Packed rows of <= 1024 tokens: the default data's 16 samples fill 8 bins of 1 to 3 samples."""


@dataclass
class Built:
    """A composed run, its container, Bridge's train dataset (built with the id hook installed, as training does)
    and the samples dataset item i holds."""

    run: Any
    cfg: Any
    train: Any
    mbs: int
    rows: int
    """Samples in the checked copy."""
    items: int
    """Distinct dataset items: the rows, or packed the bins."""
    samples_of: Callable[[int], list[int]]
    """Dataset index -> the samples (checked-copy rows) that item holds, in order."""


@pytest.fixture(scope="module", params=["padded", "packed"])
def built(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Built:
    from megatron.bridge.data.utils import get_dataset_provider

    from vlmtrain.config.compose import compose

    packed = request.param == "packed"
    mbs = 1 if packed else 2  # a packed micro-batch is one bin (one row)
    extra = [f"data.packing={CAPACITY}"] if packed else ["data.packing=false"]
    run = compose([f"train.micro_batch_size={mbs}", *extra], output_dir=str(tmp_path_factory.mktemp("run")))
    prepared = prepare.prepare(run, resolve(run))
    rows = len(prepared.jsonl.read_text().splitlines())
    cfg = container.build(run, resolve(run))
    if packed:
        from vlmtrain.data.bins import Bins

        bins = Bins.load(cfg.dataset.bins_file).bins  # the bins file the ranks read
        assert bins == prepared.bins.bins and len(bins) % DP == 0 and len(bins) >= 2 * DP
        assert max(map(len, bins)) > 1  # rows of several samples
        items, samples_of = len(bins), lambda i: bins[i % len(bins)]
    else:
        items, samples_of = rows, lambda i: [i % rows]
    bridge_patches.install_sample_ids()
    bridge_patches.install_sample_ids()  # installing twice (trainer and a bench in one process) wraps once
    try:
        train, _, _ = get_dataset_provider(cfg.dataset)([items, 0, 0], cfg.dataset)
    finally:
        bridge_patches.uninstall()
    return Built(run, cfg, train, mbs, rows, items, samples_of)


def test_the_collate_is_wrapped_once_or_not_at_all(built: Built) -> None:
    """Bridge's DirectSFTDataset collate gets the hook once; vlmtrain's BinDataset keeps its own collate."""
    from megatron.bridge.data.datasets.direct_sft import DirectSFTDataset

    from vlmtrain.data.bins_dataset import BinDataset

    collate = built.train.collate_fn
    if built.run.data.packing:
        assert type(built.train) is BinDataset and collate.__func__ is BinDataset.collate_fn
    else:
        assert isinstance(built.train, DirectSFTDataset) and collate.__name__ == "collate_with_ids"
        inner = collate.__closure__[0].cell_contents
        assert getattr(inner, "__name__", "") != "collate_with_ids"


def test_checked_copy_numbers_its_rows(built: Built) -> None:
    checked = Path(prepare.prepare(built.run, resolve(built.run)).jsonl)
    rows = [json.loads(line) for line in checked.read_text().splitlines()]
    assert len(rows) >= 2 * built.mbs * DP
    assert [r[KEY] for r in rows] == list(range(len(rows)))


def test_bin_examples_carry_their_sample_index(built: Built) -> None:
    """Bridge's loader keeps `sample_index` on the examples the bins index: example i is checked-copy row i."""
    from vlmtrain.data.bins import bridge_examples

    examples = bridge_examples(built.cfg.dataset.source)
    assert [e[KEY] for e in examples] == list(range(built.rows))


def loader_ids(b: Built, consumed: int, dp_rank: int, steps: int) -> list[list[int]]:
    """The ids of `steps` micro-batches as vlmtrain's counting iterator takes them from Bridge's loader."""
    from megatron.bridge.data.samplers import build_pretraining_data_loader

    loader = build_pretraining_data_loader(b.train, consumed, "cyclic", b.mbs, 0, b.cfg.dataset.data_sharding,
                                           collate_fn=b.train.collate_fn, pin_memory=False,
                                           data_parallel_rank=dp_rank, data_parallel_size=DP)
    counters = StepCounters(b.run, resolve(b.run), nullcontext)
    batches: list[dict[str, Any]] = []

    def bridge_step(state: Any, it: Any, model: Any, return_schedule_plan: bool = False) -> None:
        batches.extend(islice(it, steps))  # what Bridge's step does: next() once per micro-batch

    counters.wrap(bridge_step)(SimpleNamespace(cfg=b.cfg), iter(loader), None)
    assert len(batches) == len(counters.sample_ids) == steps
    assert all(BATCH_KEY not in batch for batch in batches)  # Bridge's step never sees the key
    assert counters.totals["samples"] == sum(map(len, counters.sample_ids))  # the same batches were counted
    return counters.sample_ids


def sampler_samples(b: Built, consumed: int, dp_rank: int, steps: int) -> list[list[int]]:
    """What Megatron's cyclic sampler hands this rank for consumed_samples, as the samples of those items."""
    from megatron.bridge.data.samplers import MegatronPretrainingRandomSampler

    sampler = MegatronPretrainingRandomSampler(b.train, total_samples=len(b.train), consumed_samples=consumed,
                                               micro_batch_size=b.mbs, data_parallel_rank=dp_rank,
                                               data_parallel_size=DP, data_sharding=b.cfg.dataset.data_sharding)
    return [[s for i in mb for s in b.samples_of(i)] for mb in islice(iter(sampler), steps)]


def test_ids_are_the_samplers_samples_per_rank_and_after_a_resume(built: Built) -> None:
    b = built
    steps = b.items // (b.mbs * DP)  # one epoch of rows (padded) or of bins (packed)
    full = {r: loader_ids(b, 0, r, steps) for r in range(DP)}
    for r in range(DP):
        assert full[r] == sampler_samples(b, 0, r, steps)
    seen = sorted(i for r in range(DP) for mb in full[r] for i in mb)
    assert seen == list(range(b.rows))  # every sample once in the epoch: none twice, none skipped
    k = 1  # resume after one step: Bridge builds the loader at consumed_samples = 1 x MBS x DP
    for r in range(DP):
        resumed = loader_ids(b, k * b.mbs * DP, r, steps - k)
        assert resumed == sampler_samples(b, k * b.mbs * DP, r, steps - k) == full[r][k:]


def test_items_past_the_data_wrap_around(built: Built) -> None:
    """Training asks for more items than there are rows or bins (iterations x GBS): item i is row i % rows, or bin
    i % bins, so two epochs' worth of items hold every sample exactly twice, each id where the sampler put it."""
    import dataclasses

    from megatron.bridge.data.utils import get_dataset_provider

    bridge_patches.install_sample_ids()
    try:
        train, _, _ = get_dataset_provider(built.cfg.dataset)([2 * built.items, 0, 0], built.cfg.dataset)
    finally:
        bridge_patches.uninstall()
    b = dataclasses.replace(built, train=train, items=2 * built.items)
    steps = b.items // (b.mbs * DP)
    ids = {r: loader_ids(b, 0, r, steps) for r in range(DP)}
    for r in range(DP):
        assert ids[r] == sampler_samples(b, 0, r, steps)
    seen = sorted(i for r in range(DP) for mb in ids[r] for i in mb)
    assert seen == sorted(2 * list(range(b.rows)))
