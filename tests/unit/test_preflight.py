"""Each preflight rule: one composition that trips it and one that passes it (real Hydra composition)."""

from __future__ import annotations

import pytest

from vlmtrain.check import defaults, preflight
from vlmtrain.config import resolve as resolving
from vlmtrain.config.resolve import resolve

B30 = ["model=qwen3_vl_30b_a3b"]
Q35 = ["model=qwen35_vl_35b_a3b", "model.num_layers=4"]
HALF = ["data.validation_fraction=0.5"]
ENERGON_VAL = ["data=energon", "data.path=/nonexistent/energon", "data.validation=val", "train.eval_interval=5"]
# rule -> (overrides that trip it, overrides that pass it)
CASES: dict[str, tuple[list[str], list[str]]] = {
    "auto_left_off": (  # info: Qwen3.5 is not packed by default (unproven); Qwen3-VL on one H200 lacks nothing
        ["model=tiny_qwen35", "gpus_per_node=1", "dry_run=true"],
        ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "gpus_per_node=1", "dry_run=true"],
    ),
    "hybridep_topology": (
        [*B30, "hardware=gb200", "dispatcher=hybridep", "nodes=32", "train.global_batch_size=128"],
        [*B30, "hardware=gb200", "dispatcher=hybridep", "nodes=16", "train.global_batch_size=64"],
    ),
    "hybridep_crosses_nodes": (
        [*B30, "hardware=h100", "dispatcher=hybridep", "nodes=2", "train.global_batch_size=16"],
        [*B30, "hardware=h100", "dispatcher=hybridep"],
    ),
    "deepep_not_on_gb200": (["hardware=gb200", "dispatcher=deepep"], ["hardware=b200", "dispatcher=deepep"]),
    "cutlass_grouped_gemm_needs_sm90": (["kernels=fast", "hardware=b200"], ["kernels=fast", "hardware=h100"]),
    "vit_attention_head_dim_pads": ([*B30, "kernels.vit_attention_head_dim=64"],
                                    [*B30, "kernels.vit_attention_head_dim=128"]),
    "wgrad_fusion_under_fsdp": (["parallelism=fsdp", "kernels.wgrad_fusion=true"],
                                ["parallelism=3d", "kernels.wgrad_fusion=true"]),
    "te_cross_entropy_fusion": (["kernels=fast"], ["kernels=default"]),  # info: Megatron's warning explained
    "expert_wgrad_grouped_unfused_only": (
        ["parallelism=3d", "kernels.wgrad_fusion=true", "kernels.expert_wgrad=grouped"],
        ["parallelism=3d", "kernels.expert_wgrad=grouped"]),
    "precision_aware_optimizer_under_fsdp": (["parallelism=fsdp", "precision.precision_aware_optimizer=true"],
                                             ["parallelism=3d", "precision.precision_aware_optimizer=true"]),
    "fsdp_needs_pp1": (["parallelism=fsdp", "parallelism.pp=2"], ["parallelism=fsdp"]),
    "fsdp_checkpoint_format": (
        ["parallelism=fsdp", "+bridge.checkpoint.ckpt_format=torch_dist"],
        ["parallelism=fsdp", "+bridge.checkpoint.ckpt_format=fsdp_dtensor"],
    ),
    "ep_divides_experts": (["parallelism.ep=3"], ["parallelism.ep=4"]),
    "tp_divides_kv_heads": (["parallelism=3d", "parallelism.tp=4"], ["parallelism=3d", "parallelism.tp=2"]),
    "pipeline_split": (
        ["parallelism=3d", "parallelism.pp=2", "model.num_layers=5"],
        ["parallelism=3d", "parallelism.pp=2", "model.num_layers=6"],
    ),
    "vpp_divides_stage_layers": (
        ["parallelism=3d", "parallelism.pp=2", "parallelism.vpp=4"],
        ["parallelism=3d", "parallelism.pp=2", "parallelism.vpp=2"],
    ),
    "deepstack_on_first_stage": (["parallelism=3d", "parallelism.pp=4"], ["parallelism=3d", "parallelism.pp=2"]),
    "world_layout": (["gpus_per_node=16"], ["gpus_per_node=8"]),
    "partial_nodes": (["nodes=2", "gpus_per_node=4"], ["nodes=2", "train.global_batch_size=16"]),
    "global_batch_divisible": (["train.global_batch_size=12"], ["train.global_batch_size=16"]),
    "profile_step_in_run": (["train.profile_step=19"], ["train.profile_step=18"]),
    "context_parallel_seq": (
        ["parallelism=3d", "parallelism.cp=2", "train.seq_length=4098"],
        ["parallelism=3d", "parallelism.cp=2", "train.seq_length=4096"],
    ),
    "etp_while_ep_fits": (
        ["parallelism=3d", "parallelism.ep=2", "parallelism.etp=2"],
        ["parallelism=3d", "parallelism.ep=4", "parallelism.etp=1"],
    ),
    "graphs_with_full_recompute": (
        ["cuda_graph=moe_router_preprocess", "recompute=full"],
        ["cuda_graph=moe_router_preprocess", "recompute=selective"],
    ),
    "deepstack_full_recompute": (["recompute=full"], ["recompute=full", "vision=frozen_with_projector"]),
    "moe_preprocess_needs_router": (
        ["cuda_graph.modules=[moe_preprocess]"],
        ["cuda_graph.modules=[moe_router,moe_preprocess]"],
    ),
    "moe_recompute_with_router_graph": (
        ["recompute=selective", "recompute.modules=[moe]", "cuda_graph=moe_router_preprocess"],
        ["recompute=selective", "recompute.modules=[core_attn]", "cuda_graph=moe_router_preprocess"],
    ),
    "qwen3_vl_no_attn_graph": (["cuda_graph=attn_moe_router_preprocess"], ["cuda_graph=moe_router_preprocess"]),
    # a capacity makes every row static: the router/preprocess graphs are fine, an attention graph is not
    "packing_with_graphs": (
        ["cuda_graph=attn_moe_router_preprocess", "data.packing=8192"],
        ["cuda_graph=moe_router_preprocess", "data.packing=8192"],
    ),
    "packing_is_one_bin": (["data.packing=8192", "train.micro_batch_size=2"], ["data.packing=8192"]),
    "packing_needs_scanned_data": (["data=mock", "data.packing=8192"], ["data=realistic", "data.packing=8192"]),
    "packing_capacity_multiple": (
        ["parallelism=3d", "parallelism.cp=2", "data.packing=8190"],
        ["parallelism=3d", "parallelism.cp=2", "data.packing=8192"],
    ),
    "qwen35_packing_unverified": ([*Q35, "data.packing=8192"], [*Q35, "kernels=fast"]),
    "a2a_overlap_with_qwen_vl": (["+bridge.comm_overlap.overlap_moe_expert_parallel_comm=true"], []),
    "seq_fits_images": (["data=realistic", "train.seq_length=2048"], ["data=realistic", "train.seq_length=4096"]),
    "data_path_exists": (["data=jsonl", "data.path=/nonexistent/train.jsonl"], ["data=jsonl", f"data.path={__file__}"]),
    "mock_is_not_performance": (["data=mock"], ["data=sample"]),
    "memory_fits": (["model=qwen3_vl_235b_a22b", "hardware=h100"], ["model=qwen3_vl_30b_a3b"]),
    "memory_headroom": (["model=qwen3_vl_30b_a3b", "hardware=h100", "recompute=full"], ["model=qwen3_vl_30b_a3b"]),
    "frozen_vision_benchmark_only": (["vision=frozen"], ["vision=trainable"]),
    "precision_needs_hardware": (["precision=mxfp8", "hardware=h200"], ["precision=mxfp8", "hardware=gb200"]),
    "fp8_blockwise_off_hopper": (["precision=fp8", "precision.scaling=blockwise", "hardware=b200"],
                                 ["precision=fp8", "precision.scaling=blockwise", "hardware=h200"]),
    "fp8_delayed_with_bf16_layers": (["precision=fp8", "precision.scaling=delayed", "precision.bf16_layers_at_start=1"],
                                     ["precision=fp8", "precision.scaling=delayed"]),
    # fp8 tensorwise keeps Bridge's 1 + 1 BF16 layers unless told otherwise
    "bf16_layers_fit_each_stage": (["precision=fp8", "model.num_layers=2"],
                                   ["precision=fp8", "model.num_layers=2", "precision.bf16_layers_at_start=0",
                                    "precision.bf16_layers_at_end=0"]),
    "quantized_packing_alignment": (["precision=fp8", "data.packing=8200"], ["precision=fp8", "data.packing=8192"]),
    "quantized_unmeasured_combination": (["precision=fp8", "kernels=fast"], ["precision=fp8"]),
    "mxfp8_buffer_reuse_off_under_fsdp": (["hardware=gb200", "precision=mxfp8"],
                                          ["hardware=gb200", "precision=mxfp8", "parallelism=3d"]),
    # a dir with no config.json; real checkpoints that match or differ: tests/unit/test_hf_path.py
    "hf_path_matches_model": (["model.hf_path=/nonexistent/checkpoint"], []),
    # validation: the 16 sample photos, half held out = 8 = one evaluation batch at train.global_batch_size=8
    "eval_schedule": ([*HALF, "train.eval_interval=0"], [*HALF, "train.eval_interval=5"]),
    "eval_interval_needs_validation": (["train.eval_interval=5"], [*HALF, "train.eval_interval=5"]),
    "validation_needs_eval_interval": (HALF, [*HALF, "train.eval_interval=5"]),
    "validation_fraction_range": (["data.validation_fraction=1.5", "train.eval_interval=5"],
                                  [*HALF, "train.eval_interval=5"]),
    "validation_source_fits_kind": (["data=mock", *HALF, "train.eval_interval=5"], [*HALF, "train.eval_interval=5"]),
    "validation_path_exists": (
        ["data=jsonl", f"data.path={__file__}", "data.validation=/nonexistent/val.jsonl", "train.eval_interval=5"],
        ["data=jsonl", f"data.path={__file__}", f"data.validation={__file__}", "train.eval_interval=5"],
    ),
    # the 16 sample photos fill one packed row of 12288 tokens, fewer than the default GBS of 8 rows
    "data_fills_global_batch": (["gpus_per_node=1", "data.packing=12288"],
                                ["gpus_per_node=1", "data.packing=12288", "train.global_batch_size=1"]),
    "validation_fills_eval_batch": (["data.validation_fraction=0.25", "train.eval_interval=5"],
                                    [*HALF, "train.eval_interval=5"]),
    "energon_eval_micro_batch": (
        [*ENERGON_VAL, "+bridge.validation.eval_micro_batch_size=2"],
        [*ENERGON_VAL, "+bridge.validation.eval_micro_batch_size=1"],
    ),
}


PLACED = {"auto_left_off"}
"""Rules about what check.defaults settles: their cases are placed on the declared world first, as train.py's."""


def rules_of(compose, overrides: list[str], placed: bool = False) -> dict[str, preflight.Finding]:
    run = compose(*overrides)
    res = defaults.placed(run, node_gpus=0)[1] if placed else resolve(run)
    return {f.rule: f for f in preflight.check(run, res)}


def test_every_rule_has_cases():
    missing = {fn.__name__ for _, fn in preflight.RULES} - set(CASES)
    assert not missing, f"rules without a trip/pass case: {sorted(missing)}"


def test_an_epoch_shorter_than_a_step_is_refused_packed_or_not(compose):
    """The rows the data fills against one global batch: unpacked its samples (file metadata), packed the data
    stage's bins at the capacity; the message names the largest GBS that fits."""
    unpacked = rules_of(compose, ["data=realistic", "data.payload.num_samples=4", "data.packing=false",
                                  "gpus_per_node=1"])["data_fills_global_batch"].message
    assert "holds 4 training samples, fewer than one global batch of train.global_batch_size=8" in unpacked
    assert "Use train.global_batch_size=4" in unpacked
    packed = rules_of(compose, ["gpus_per_node=1", "data.packing=12288"])["data_fills_global_batch"].message
    assert "16 training samples fill 1 packed rows of <= 12288 tokens" in packed
    assert "Use train.global_batch_size=1" in packed and "a smaller data.packing" in packed


def test_memory_refusal_offers_what_helps_this_layout(compose):
    """H1 on one H100 with its row named (data.packing=false: the defaults relieve nothing): the refusal offers more
    GPUs and the precision-aware optimizer, not the micro-batch it already has at 1 or an EP one GPU cannot hold."""
    msg = rules_of(compose, ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "hardware=h100",
                             "gpus_per_node=1", "parallelism=3d", "data.packing=false"])["memory_fits"].message
    tries = msg.split(". Try ")[1]
    assert "precision.precision_aware_optimizer=true" in tries and "more GPUs" in tries
    assert "train.micro_batch_size" not in tries and "parallelism.ep" not in tries


def test_graph_messages_give_the_reason(compose):
    """The attention-graph refusal says why (cu_seqlens change with every bin) and what works instead."""
    msg = rules_of(compose, ["cuda_graph=attn_moe_router_preprocess", "data.packing=8192"])["packing_with_graphs"]
    assert "cu_seqlens" in msg.message and "cuda_graph=moe_router_preprocess" in msg.message
    # the quantized multiple is its own finding; the general multiple rule leaves it to that one
    found = rules_of(compose, ["precision=fp8", "data.packing=8200"])
    assert "quantized_packing_alignment" in found and "packing_capacity_multiple" not in found


def test_capacity_resolves_the_row(compose):
    """What resolve derives for a capacity: the row length, static rows (forced by graphs and PP>1), the segment
    alignment (CP/SP and the quantized GEMMs' multiple), and GBS counting rows."""
    res = resolve(compose("data.packing=8192", "gpus_per_node=2", "train.global_batch_size=8"))
    assert (res.packing_capacity, res.seq_length, res.packing_static, res.pack_align) == (8192, 8192, False, 1)
    assert res.grad_accum == 4 and not res.pads_to_seq_length
    assert resolve(compose("data.packing=8192", "cuda_graph=moe_router_preprocess")).packing_static
    assert resolve(compose("data.packing=8192", "parallelism=3d", "parallelism.pp=2")).packing_static
    assert resolve(compose("data.packing=8192", "data.packing_static=true")).packing_static
    assert resolve(compose("data.packing=8192", "parallelism=3d", "parallelism.cp=2", "parallelism.tp=2",
                           "precision=fp8")).pack_align == 16
    assert resolve(compose("data.packing=8192", "parallelism=3d", "parallelism.cp=4")).pack_align == 8
    off = resolve(compose())
    assert (off.packing_capacity, off.packing_static, off.pack_align) == (None, False, 1)


def test_unmeasured_fp8_recipe_is_warned(compose):
    """Delayed scaling is offered but was not measured: the warning says which recipes were."""
    msg = rules_of(compose, ["precision=fp8", "precision.scaling=delayed"])["quantized_unmeasured_combination"].message
    assert "delayed scaling" in msg and "tensorwise and blockwise" in msg
    assert "quantized_unmeasured_combination" not in rules_of(compose, ["precision=fp8", "precision.scaling=blockwise"])


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_trips_and_passes(compose, rule):
    trip, ok = CASES[rule]
    found = rules_of(compose, trip, rule in PLACED)
    assert rule in found, f"{rule} did not trip for {trip}: {sorted(found)}"
    assert "=" in found[rule].message or "." in found[rule].message  # names the group/field involved
    assert rule not in rules_of(compose, ok, rule in PLACED), f"{rule} tripped for the passing case {ok}"


def test_enforce_raises_with_every_error_and_keeps_warnings(compose):
    with pytest.raises(preflight.PreflightError) as err:
        refused = compose("hardware=gb200", "dispatcher=deepep", "parallelism.pp=2")
        preflight.enforce(refused, resolve(refused))
    assert {f.rule for f in err.value.findings} >= {"deepep_not_on_gb200", "fsdp_needs_pp1"}
    mock = compose("data=mock")
    warnings = preflight.enforce(mock, resolve(mock))
    assert [w.rule for w in warnings] == ["mock_is_not_performance"]


def test_ignore_downgrades_an_error(compose):
    run = compose("parallelism.pp=2", "preflight.ignore=[fsdp_needs_pp1]")
    assert not preflight.errors(preflight.check(run, resolve(run)))


def test_deepstack_needs_as_many_decoder_layers_without_pipeline(compose):
    """Reduced depth below the deepstack count: the message offers the deepstack mergers that fit, and that fixes it."""
    found = rules_of(compose, ["model=qwen3_vl_235b_a22b", "model.num_layers=1", "gpus_per_node=1"])
    message = found["deepstack_on_first_stage"].message
    assert "model.num_layers>=3" in message and "model.vit.deepstack_indexes=[8]" in message
    fixed = ["model=qwen3_vl_235b_a22b", "model.num_layers=1", "model.vit.deepstack_indexes=[8]", "gpus_per_node=1"]
    assert "deepstack_on_first_stage" not in rules_of(compose, fixed)


def test_bridge_override_of_a_degree_is_checked_like_the_group_knob(compose):
    """`+bridge.model.pipeline_model_parallel_size=2` is what Bridge gets, so the resolved layout (and every rule
    reading it) sees PP 2: FSDP refuses it exactly as it refuses parallelism.pp=2."""
    via_bridge = rules_of(compose, ["parallelism=fsdp", "+bridge.model.pipeline_model_parallel_size=2"])
    via_group = rules_of(compose, ["parallelism=fsdp", "parallelism.pp=2"])
    assert via_bridge["fsdp_needs_pp1"] == via_group["fsdp_needs_pp1"]
    assert via_bridge["fsdp_needs_pp1"].severity == preflight.Severity.error


def test_resolved_round_trips_through_run_json(compose, tmp_path):
    res = resolve(compose("parallelism=3d", "parallelism.pp=2", "cuda_graph=moe_router_preprocess"))
    resolving.save(res, tmp_path)
    assert resolving.load(tmp_path) == res
    assert resolving.load(tmp_path / "missing") is None


RESOLVED_LAYOUTS = [
    ["parallelism=fsdp"],
    ["parallelism=3d", "parallelism.tp=2", "parallelism.pp=2", "parallelism.ep=2"],
    ["parallelism=3d", "+bridge.model.pipeline_model_parallel_size=2", "+bridge.model.tensor_model_parallel_size=2",
     "train.global_batch_size=16"],
    ["parallelism=fsdp", "+bridge.model.expert_model_parallel_size=2", "cuda_graph=moe_router_preprocess"],
]


@pytest.mark.parametrize("overrides", RESOLVED_LAYOUTS, ids=[" ".join(o) for o in RESOLVED_LAYOUTS])
def test_resolved_matches_the_finalized_container(compose, bridge, overrides, tmp_path):
    """What resolve derives is what Bridge ends up with after finalization on the declared target."""
    from vlmtrain.build import container, target

    run = compose(*overrides, output_dir=str(tmp_path))
    res = resolve(run)
    assert not preflight.errors(preflight.check(run, res))
    cfg = container.build(run, res)
    target.finalize(run, resolve(run), cfg)
    lay, m = res.layout, cfg.model
    assert (lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.etp) == (
        m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size,
        m.context_parallel_size, m.expert_model_parallel_size, m.expert_tensor_parallel_size)
    assert lay.dp == cfg.data_parallel_size
    assert lay.world_size == cfg.data_parallel_size * lay.tp * lay.pp * lay.cp
    assert res.grad_accum == cfg.train.global_batch_size // (cfg.train.micro_batch_size * cfg.data_parallel_size)
    assert res.pad_to_max_length == cfg.dataset.pad_to_max_length
    assert res.env_vars == {k: str(v) for k, v in cfg.env_vars.items()}
