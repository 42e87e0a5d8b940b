"""The H2 peer's dry run on CPU: Megatron Bridge's own Qwen3.5-VL-35B-A3B Megatron-FSDP SFT recipe, built by Bridge's
recipe function and validated by Bridge's runtime_config_update for one H200, keeps the recipe's fields (FSDP, MBS 4,
GBS 32, full recompute, every tower trainable) and changes only those listed (vlmtrain.lab.bridge_benchmarks.H2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vlmtrain.lab import bridge_recipe
from vlmtrain.lab.bridge_benchmarks import H2, LAYERS


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any]:
    out = tmp_path_factory.mktemp("bridge-recipe-h2")
    shipped = bridge_recipe.shipped(H2, *bridge_recipe.bench_run(H2, out / "shipped"))
    return bridge_recipe.dry_run(H2, out / "dry-run"), shipped  # what `--benchmark h2 --dry-run` runs


def test_recipe_fields_kept(built: tuple[dict[str, Any], Any]) -> None:
    facts, shipped = built
    assert (facts["micro_batch_size"], facts["global_batch_size"]) == (
        shipped.train.micro_batch_size, shipped.train.global_batch_size) == (4, 32)
    assert facts["use_megatron_fsdp"] and shipped.ddp.use_megatron_fsdp
    assert facts["recompute_granularity"] == shipped.model.recompute_granularity
    assert facts["moe_token_dispatcher_type"] == shipped.model.moe_token_dispatcher_type
    assert not any(facts[f"freeze_{t}"] for t in ("language_model", "vision_model", "vision_projection"))
    assert facts["dataset"] == type(shipped.dataset).__name__
    assert facts["seq_length"] == 4096 and "bf16=True" in facts["mixed_precision"]
    # 4 layers in the published pattern: 3 Gated DeltaNet, then full attention
    assert facts["linear_attention_freq"] == shipped.model.linear_attention_freq


def test_only_listed_fields_changed(built: tuple[dict[str, Any], Any]) -> None:
    facts, shipped = built
    assert (shipped.model.expert_model_parallel_size, shipped.model.num_layers) == (H2.ep, H2.hub_layers)
    assert (facts["expert_model_parallel_size"], facts["num_layers"]) == (1, LAYERS)
    assert shipped.model.mtp_num_layers and not facts["mtp_num_layers"]
    assert str(facts["data_files"]["train"]).endswith(".jsonl")
    assert shipped.checkpoint.save and facts["checkpoint_save"] is None
    assert facts["train_iters"] == bridge_recipe.ITERATIONS
    for field in ("model.expert_model_parallel_size", "model.num_layers", "model.mtp_num_layers", "train.train_iters",
                  "dataset.source", "checkpoint.save/load"):
        assert field in H2.all_changes()


def test_the_peer_runs_its_benchmark() -> None:
    cmd = bridge_recipe.command(H2, Path("outputs/x/run0"), 29511)
    assert cmd[-3:] == [H2.run.module, "h2", "outputs/x/run0"]
