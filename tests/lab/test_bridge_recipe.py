"""The peers' dry run on CPU: Megatron Bridge's own Qwen3-VL-30B-A3B SFT recipe (H1; H2's Qwen3.5-VL-35B-A3B recipe
in test_bridge_recipe_h2.py), built by Bridge's recipe function and validated by Bridge's runtime_config_update for
one H200, keeps the recipe's fields and changes only those listed (vlmtrain.lab.bridge_benchmarks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vlmtrain.lab import bridge_recipe
from vlmtrain.lab.bridge_benchmarks import H1, LAYERS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any]:
    out = tmp_path_factory.mktemp("bridge-recipe")
    shipped = bridge_recipe.shipped(H1, *bridge_recipe.bench_run(H1, out / "shipped"))
    return bridge_recipe.dry_run(H1, out / "dry-run"), shipped  # what `--benchmark h1 --dry-run` runs


def test_recipe_fields_kept(built: tuple[dict[str, Any], Any]) -> None:
    facts, shipped = built
    assert (facts["micro_batch_size"], facts["global_batch_size"]) == (2, 32) == (
        shipped.train.micro_batch_size, shipped.train.global_batch_size)
    assert facts["moe_token_dispatcher_type"] == shipped.model.moe_token_dispatcher_type == "alltoall"
    assert not any(facts[f"freeze_{t}"] for t in ("language_model", "vision_model", "vision_projection"))
    assert facts["enable_in_batch_packing"] and facts["defer_in_batch_packing_to_step"]  # packing left to its step
    assert facts["dataset"] == type(shipped.dataset).__name__ == "DirectHFSFTDatasetConfig"
    assert facts["seq_length"] == 4096 and facts["tensor_model_parallel_size"] == 1
    assert facts["pretrained_checkpoint"] is None and "bf16=True" in facts["mixed_precision"]


def test_only_listed_fields_changed(built: tuple[dict[str, Any], Any]) -> None:
    facts, shipped = built
    assert (shipped.model.expert_model_parallel_size, shipped.model.num_layers) == (8, 48)
    assert (facts["expert_model_parallel_size"], facts["num_layers"]) == (1, LAYERS) == (1, 4)
    assert shipped.dataset.source.dataset_name == "cord_v2" and facts["source"] == "json"
    assert str(facts["data_files"]["train"]).endswith(".jsonl")  # vlmtrain's checked data=realistic copy
    assert shipped.checkpoint.save and facts["checkpoint_save"] is None
    assert facts["train_iters"] == bridge_recipe.ITERATIONS and shipped.train.train_iters == 50
    for field in ("model.expert_model_parallel_size", "model.num_layers", "train.train_iters", "dataset.source",
                  "checkpoint.save/load", "model.gradient_accumulation_fusion"):
        assert field in H1.all_changes()


def test_one_torchrun_process_per_run() -> None:
    cmd = bridge_recipe.command(H1, Path("outputs/x/run0"), 29511)
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--nproc-per-node=1"]
    assert cmd[-6:] == ["--master-port", "29511", "-m", H1.run.module, "h1", "outputs/x/run0"]


def test_the_peer_counts_bridge_s_own_micro_batches(tmp_path: Path) -> None:
    """The recipe's dataset, built by Bridge from the realistic files, collates a micro-batch of MBS 2 (unpacked: its
    step packs); vlmtrain's counters read its real tokens, images and FLOPs as they read vlmtrain's own batches."""
    from contextlib import nullcontext

    from megatron.bridge.data.builders.direct_hf_sft import direct_hf_sft_train_valid_test_datasets_provider

    from vlmtrain.build import target
    from vlmtrain.config import flops
    from vlmtrain.train.step_counters import StepCounters

    run, res = bridge_recipe.bench_run(H1, tmp_path / "run")
    cfg = bridge_recipe.recipe_config(H1, run, res)
    target.finalize(run, res, cfg)
    train, valid, test = direct_hf_sft_train_valid_test_datasets_provider([4, 0, 0], cfg.dataset)
    assert valid is None and test is None
    batch = train.collate_fn([train[0], train[1]])
    counters = StepCounters(run, res, nullcontext)
    counters.image_token_id = cfg.model.image_token_id
    counters.count(batch)
    t, lengths = counters.totals, batch["attention_mask"].sum(dim=1).tolist()
    assert t["samples"] == 2 and t["nonpad_tokens"] == sum(lengths) < t["padded_tokens"] == batch["input_ids"].numel()
    assert [s["len"] for s in counters.samples] == lengths
    assert 0 < t["image_tokens"] < t["nonpad_tokens"] and t["images"] == len(batch["visual_inputs"].image_grid_thw)
    assert t["vit_patches"] == 4 * t["image_tokens"]  # 2x2 merge: every patch reached the decoder as an image token
    fl = flops.step_flops(run, counters.samples)
    assert fl.vit > 0 and fl.projector > 0 and fl.decoder > 0
