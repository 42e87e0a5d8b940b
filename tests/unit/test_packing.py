"""data.packing on the real path: vlmtrain's ConfigContainer -> Bridge's dataset and Qwen collate on real photos ->
the batch Bridge's vlm_step hands to Qwen3VLModel, and the step counters that turn it into throughput."""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from vlmtrain.build import container, target
from vlmtrain.check import preflight
from vlmtrain.train.step_counters import StepCounters

# EP 2: without packing Bridge pads every sample to seq_length; MBS 4 samples per micro-batch.
RUN = ["data=realistic", "data.payload.num_samples=16", "gpus_per_node=2", "train.micro_batch_size=4",
       "train.global_batch_size=8"]


def _collate(compose, bridge, tmp_path, *overrides: str):
    from megatron.bridge.data.utils import get_dataset_provider

    run = compose(*RUN, *overrides, output_dir=str(tmp_path))
    assert not preflight.errors(preflight.check(run))
    cfg = container.build(run)
    target.finalize(run, cfg)  # Bridge's own validation, as the dry-run plan does
    train, _, _ = get_dataset_provider(cfg.dataset)([16, 0, 0], cfg.dataset)
    return run, cfg, train.collate_fn([train[i] for i in range(4)])


def _counts(run, batch, image_token_id: int) -> dict[str, int]:
    counters = StepCounters(run, nullcontext)
    counters.image_token_id = image_token_id
    counters.count(batch)
    return counters.totals | {"per_sample": [(s["len"], tuple(s["patches"])) for s in counters.samples]}


def test_packing_runs_real_tokens_only(compose, bridge, tmp_path):
    run_pad, cfg_pad, padded = _collate(compose, bridge, tmp_path / "padded")
    run_pack, cfg_pack, packed = _collate(compose, bridge, tmp_path / "packed", "data.packing=true")

    # Without packing, EP 2 pads all 4 samples to seq_length; packed, one row holds the 4 samples' real tokens.
    assert padded["input_ids"].shape == (4, run_pad.train.seq_length)
    lengths = padded["attention_mask"].sum(dim=1)
    cu = packed["cu_seqlens_q"]
    assert packed["input_ids"].shape[0] == 1 and cu.tolist()[0] == 0
    assert (cu[1:] - cu[:-1]).tolist() == lengths.tolist()
    assert packed["input_ids"].shape[1] < 4 * run_pad.train.seq_length / 2
    starts = packed.get("cu_seqlens_q_padded", cu)[:-1].tolist()
    for row, start, n in zip(padded["input_ids"], starts, lengths.tolist(), strict=True):
        assert packed["input_ids"][0, start : start + n].tolist() == row[:n].tolist()
    assert int(packed["loss_mask"].sum()) == int(padded["loss_mask"].sum())

    # The same samples count the same useful work; only the tokens the model runs differ.
    image_token_id = cfg_pad.model.image_token_id
    c_pad, c_pack = _counts(run_pad, padded, image_token_id), _counts(run_pack, packed, image_token_id)
    assert c_pad["padded_tokens"] == 4 * run_pad.train.seq_length
    assert c_pack["padded_tokens"] == packed["input_ids"].shape[1]
    assert c_pack["nonpad_tokens"] == c_pad["nonpad_tokens"] == int(lengths.sum())
    for key in ("samples", "image_tokens", "text_tokens", "loss_tokens", "images", "vit_patches", "per_sample"):
        assert c_pack[key] == c_pad[key], key

    # Bridge's Qwen3-VL step refuses packed batches; vlmtrain trains them through Bridge's vlm_step.
    from megatron.bridge.models.qwen_vl import qwen3_vl_step
    from megatron.bridge.training import vlm_step

    from vlmtrain.config.groups import data

    assert data.forward_step(run_pack) is vlm_step.forward_step
    assert data.forward_step(run_pad) is qwen3_vl_step.forward_step
    with pytest.raises(ValueError, match="collate-time in-batch packing"):
        qwen3_vl_step.get_batch_from_iterator(iter([packed]), is_first_pp_stage=True, is_last_pp_stage=True)
