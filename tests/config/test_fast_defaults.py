"""The `auto` defaults settled where a run is placed (check.defaults), per model family, hardware and world: through
the real Hydra composition, preflight and the real Bridge ConfigContainer, finalized for the declared target."""

from __future__ import annotations

import pytest

from vlmtrain.build import container, target
from vlmtrain.check import defaults, memory, preflight
from vlmtrain.config import resolve as resolving
from vlmtrain.config.compose import compose

H1 = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "hardware=h200", "gpus_per_node=1"]
"""Issue 23's benchmark H1 as a user names it: model, data, hardware and world only."""
KERNEL_FIELDS = ("moe_grouped_gemm", "router_fusion", "cross_entropy", "rope", "vit_positions", "pin_visual_inputs",
                 "vit_host_grid", "mask_grid_only", "vit_attention_head_dim", "wgrad_fusion", "expert_wgrad")


def placed(*overrides: str, tmp: str = "outputs/test"):
    """As train.py's dry run: composed, placed on the declared world (no local GPU counted), settled, resolved."""
    run = compose([*overrides, "dry_run=true"], output_dir=tmp)
    return run, defaults.placed(run, node_gpus=0)[1]


def left_off(run, res) -> dict[str, str]:
    return {f.message.split(" off: ")[0]: f.message for f in preflight.check(run, res) if f.rule == "auto_left_off"}


def test_h1_defaults_are_the_one_h200_preset(bridge, tmp_path):
    """At H1 the defaults run experiment=perf_h200_best's layout and kernels, packed at the largest row the memory
    estimate fits: 12288 (141.0 of 141 GiB; the preset's 12032 keeps 1.7 GiB of the estimate's headroom)."""
    run, res = placed(*H1, tmp=str(tmp_path))
    best = compose(["experiment=perf_h200_best"])
    assert run.parallelism.kind == "3d" and res.layout.ep == 1 and res.layout.world_size == 1
    assert {f: getattr(run.kernels, f) for f in KERNEL_FIELDS} == {f: getattr(best.kernels, f) for f in KERNEL_FIELDS}
    cap = res.packing_capacity
    assert best.data.packing <= cap <= defaults.PACK_ROWS * run.train.seq_length and cap % defaults.PACK_STEP == 0
    assert memory.estimate(run, res).total <= run.hardware.memory_gib
    assert not preflight.errors(preflight.check(run, res)) and left_off(run, res) == {}
    assert {a.option for a in res.auto} >= {"parallelism", "data.packing", "kernels.wgrad_fusion"}
    cfg = container.build(run, res)
    target.finalize(run, res, cfg)
    assert (cfg.model.seq_length, cfg.dataset.seq_length) == (cap, cap)
    assert cfg.model.gradient_accumulation_fusion and cfg.model.moe_router_fusion
    assert cfg.model.cross_entropy_fusion_impl == "te" and not cfg.ddp.use_megatron_fsdp
    assert cfg.model.expert_model_parallel_size == 1 and cfg.env_vars["NVTE_USE_CUTLASS_GROUPED_GEMM"] == "1"


def test_a_longer_sequence_steps_the_capacity_down_to_fit():
    run, res = placed(*H1, "train.seq_length=8192")
    assert res.packing_capacity < defaults.PACK_ROWS * 8192
    assert memory.estimate(run, res).total <= run.hardware.memory_gib
    bigger = compose([*H1, f"data.packing={res.packing_capacity + defaults.PACK_STEP}"])
    assert memory.estimate(bigger, resolving.resolve(bigger)).total > run.hardware.memory_gib


def test_more_gpus_keep_fsdp_and_say_what_it_leaves_off(bridge, tmp_path):
    run, res = placed("model=tiny", "data=realistic", "gpus_per_node=8", tmp=str(tmp_path))
    assert run.parallelism.kind == "fsdp" and not run.kernels.wgrad_fusion and res.packing_capacity
    assert run.kernels.vit_attention_head_dim is None  # the tiny ViT's 64-channel heads: padding not measured
    assert set(left_off(run, res)) == {"kernels.wgrad_fusion", "kernels.vit_attention_head_dim"}
    assert "parallelism=fsdp" in left_off(run, res)["kernels.wgrad_fusion"]
    cfg = container.build(run, res)
    target.finalize(run, res, cfg)
    assert cfg.ddp.use_megatron_fsdp and not cfg.model.gradient_accumulation_fusion
    assert cfg.model.seq_length == res.packing_capacity


def test_qwen35_gets_the_fast_kernels_and_no_packing(bridge, tmp_path):
    run, res = placed("model=tiny_qwen35", "gpus_per_node=1", tmp=str(tmp_path))
    off = left_off(run, res)
    assert res.packing_capacity is None and "issue 48" in off["packing"]
    assert run.kernels.rope == "te" and run.kernels.moe_grouped_gemm == "cutlass"
    assert {"kernels.vit_host_grid", "kernels.wgrad_fusion"} <= set(off)
    assert not preflight.errors(preflight.check(run, res))
    container.build(run, res)


def test_blackwell_keeps_only_what_is_exact_on_any_gpu():
    run, res = placed("model=tiny", "hardware=b200", "gpus_per_node=1")
    off = left_off(run, res)
    assert res.packing_capacity is None and "SM90" in off["packing"]
    assert run.kernels.moe_grouped_gemm == "multistream" and "SM90-only" in off["kernels.moe_grouped_gemm"]
    assert run.kernels.rope == "te" and run.kernels.mask_grid_only and not run.kernels.router_fusion
    assert not preflight.errors(preflight.check(run, res))


@pytest.mark.parametrize(("overrides", "why"), [
    (["data=mock"], "data scan"),
    (["data=sample"], "smoke set"),  # the default data: 16 photos would fill one row
    (["train.micro_batch_size=2"], "train.micro_batch_size=2"),
    (["precision=fp8"], "BF16"),
    (["data.truncate_long_samples=true"], "cuts"),
    (["cuda_graph=attn_moe_router_preprocess"], "CUDA graph"),
])
def test_packing_stays_off_where_it_cannot_run(overrides, why):
    run, res = placed("model=tiny", "data=realistic", *overrides)
    assert res.packing_capacity is None and why in left_off(run, res)["packing"]


def test_explicit_values_win():
    run, res = placed("model=qwen3_vl_30b_a3b", "model.num_layers=4", "gpus_per_node=1", "data.packing=false",
                      "parallelism=fsdp", "kernels.vit_attention_head_dim=96")
    assert res.packing_capacity is None and run.parallelism.kind == "fsdp"
    assert run.kernels.vit_attention_head_dim == 96 and run.kernels.rope == "te"
    assert {a.option for a in res.auto}.isdisjoint({"data.packing", "parallelism", "kernels.vit_attention_head_dim"})
    run, res = placed("model=tiny", "kernels=default", "gpus_per_node=1")
    assert res.auto and not any(a.option.startswith("kernels.") for a in res.auto)
    assert not run.kernels.router_fusion and run.kernels.rope == "unfused"
    run, res = placed("experiment=perf_h200_best")
    assert res.auto == () and res.packing_capacity == 12032


def test_unsettled_auto_reads_as_before():
    """A run resolved without placement (a library caller) keeps Bridge's kernels, FSDP and no packing."""
    run = compose(["model=tiny"])
    res = resolving.resolve(run)
    assert run.kernels.auto and run.parallelism.kind == "auto" and run.data.packing == "auto"
    assert res.packing_capacity is None and res.auto == () and not run.kernels.router_fusion


def test_settled_values_round_trip_in_run_json(tmp_path):
    run, res = placed("model=tiny", "gpus_per_node=1")
    resolving.save(res, tmp_path)
    assert resolving.load(tmp_path) == res and res.auto
    assert defaults.settle(run).auto == ()  # settled once: nothing auto is left
