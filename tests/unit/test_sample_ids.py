"""Sample ids on the real data path: the checked copy's `sample_index` -> Bridge's DirectSFTDataset and Qwen collate
(with vlmtrain's id hook installed) -> Bridge's loader and Megatron's cyclic sampler -> the step counters' iterator,
which takes the ids off each batch. They must be exactly the rows the sampler hands out for consumed_samples, per
data-parallel rank, also when the loader starts at consumed_samples = k (how Bridge restores the data position on
resume), padded and packed."""

from __future__ import annotations

import json
from contextlib import nullcontext
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vlmtrain.build import container
from vlmtrain.data import prepare
from vlmtrain.data.sample_ids import BATCH_KEY, KEY
from vlmtrain.train import bridge_patches
from vlmtrain.train.step_counters import StepCounters

MBS, DP = 2, 2


@pytest.fixture(scope="module", params=["padded", "packed"])
def built(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any, int]:
    """(run, container, Bridge's train dataset with the id hook, rows in the checked copy)."""
    from megatron.bridge.data.utils import get_dataset_provider

    from vlmtrain.config.compose import compose

    extra = ["data.packing=true"] if request.param == "packed" else []
    run = compose([f"train.micro_batch_size={MBS}", *extra], output_dir=str(tmp_path_factory.mktemp("run")))
    rows = prepare.prepare(run).jsonl.read_text().splitlines()
    cfg = container.build(run)
    bridge_patches.install_sample_ids()
    try:
        train, _, _ = get_dataset_provider(cfg.dataset)([len(rows), 0, 0], cfg.dataset)
    finally:
        bridge_patches.uninstall()
    return run, cfg, train, len(rows)


def test_checked_copy_numbers_its_rows(built: tuple[Any, Any, Any, int]) -> None:
    run = built[0]
    rows = [json.loads(line) for line in Path(prepare.prepare(run).jsonl).read_text().splitlines()]
    assert len(rows) >= 2 * MBS * DP
    assert [r[KEY] for r in rows] == list(range(len(rows)))


def loader_ids(run: Any, cfg: Any, train: Any, consumed: int, dp_rank: int, steps: int) -> list[list[int]]:
    """The ids of `steps` micro-batches as vlmtrain's counting iterator takes them from Bridge's loader."""
    from megatron.bridge.data.samplers import build_pretraining_data_loader

    loader = build_pretraining_data_loader(train, consumed, "cyclic", MBS, 0, cfg.dataset.data_sharding,
                                           collate_fn=train.collate_fn, pin_memory=False,
                                           data_parallel_rank=dp_rank, data_parallel_size=DP)
    counters = StepCounters(run, nullcontext)
    batches: list[dict[str, Any]] = []

    def bridge_step(state: Any, it: Any, model: Any, return_schedule_plan: bool = False) -> None:
        batches.extend(islice(it, steps))  # what Bridge's step does: next() once per micro-batch

    counters.wrap(bridge_step)(SimpleNamespace(cfg=cfg), iter(loader), None)
    assert all(BATCH_KEY not in b for b in batches)  # Bridge's step never sees the key
    assert counters.totals["samples"] == steps * MBS  # the same batches were counted
    return counters.sample_ids


def sampler_rows(train: Any, cfg: Any, rows: int, consumed: int, dp_rank: int, steps: int) -> list[list[int]]:
    """What Megatron's cyclic sampler hands this rank for consumed_samples, as rows of the checked copy."""
    from megatron.bridge.data.samplers import MegatronPretrainingRandomSampler

    sampler = MegatronPretrainingRandomSampler(train, total_samples=len(train), consumed_samples=consumed,
                                               micro_batch_size=MBS, data_parallel_rank=dp_rank,
                                               data_parallel_size=DP, data_sharding=cfg.dataset.data_sharding)
    return [[i % rows for i in mb] for mb in islice(iter(sampler), steps)]


def test_ids_are_the_samplers_rows_per_rank_and_after_a_resume(built: tuple[Any, Any, Any, int]) -> None:
    run, cfg, train, rows = built
    steps = rows // (MBS * DP)  # one epoch
    full = {r: loader_ids(run, cfg, train, 0, r, steps) for r in range(DP)}
    for r in range(DP):
        assert full[r] == sampler_rows(train, cfg, rows, 0, r, steps)
    seen = sorted(i for r in range(DP) for mb in full[r] for i in mb)
    assert seen == sorted(set(seen)) and len(seen) == steps * MBS * DP  # none twice, none skipped
    k = 1  # resume after one step: Bridge builds the loader at consumed_samples = 1 x MBS x DP
    for r in range(DP):
        resumed = loader_ids(run, cfg, train, k * MBS * DP, r, steps - k)
        assert resumed == sampler_rows(train, cfg, rows, k * MBS * DP, r, steps - k) == full[r][k:]
