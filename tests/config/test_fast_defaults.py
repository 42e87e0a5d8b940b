"""The `auto` defaults settled where a run is placed (check.defaults), per model family, hardware and world: through
the real Hydra composition, preflight and the real Bridge ConfigContainer, finalized for the declared target."""

from __future__ import annotations

import pytest

from vlmtrain.build import container, plan, target
from vlmtrain.check import defaults, memory, preflight
from vlmtrain.config import resolve as resolving
from vlmtrain.config.compose import compose
from vlmtrain.config.groups.train import eval_global_batch_size
from vlmtrain.data import prepare
from vlmtrain.data.export import export

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
    """At H1 the defaults run experiment=perf_h200_best's layout and kernels, packed at the largest row whose memory
    estimate keeps preflight's headroom (no memory_headroom warning, where 12288 rows left none) and that holds the
    command's 8 samples per step in one row (GBS settled to rows)."""
    run, res = placed(*H1, tmp=str(tmp_path))
    best = compose(["experiment=perf_h200_best"])
    assert run.parallelism.kind == "3d" and res.layout.ep == 1 and res.layout.world_size == 1
    assert {f: getattr(run.kernels, f) for f in KERNEL_FIELDS} == {f: getattr(best.kernels, f) for f in KERNEL_FIELDS}
    cap = res.packing_capacity
    assert run.train.seq_length < cap <= best.data.packing and cap % defaults.PACK_STEP == 0
    assert memory.estimate(run, res).total <= memory.TIGHT * run.hardware.memory_gib
    findings = preflight.check(run, res)
    assert not preflight.errors(findings) and left_off(run, res) == {}
    assert "memory_headroom" not in {f.rule for f in findings}
    assert {a.option for a in res.auto} >= {"parallelism", "data.packing", "train.global_batch_size",
                                            "kernels.wgrad_fusion"}
    assert not run.precision.precision_aware_optimizer  # nothing relieved where the row alone fits
    cfg = container.build(run, res)
    target.finalize(run, res, cfg)
    assert (cfg.model.seq_length, cfg.dataset.seq_length) == (cap, cap)
    assert cfg.train.global_batch_size == run.train.global_batch_size == 1
    assert cfg.model.gradient_accumulation_fusion and cfg.model.moe_router_fusion
    assert cfg.model.cross_entropy_fusion_impl == "te" and not cfg.ddp.use_megatron_fsdp
    assert cfg.model.expert_model_parallel_size == 1 and cfg.env_vars["NVTE_USE_CUTLASS_GROUPED_GEMM"] == "1"


def test_memory_keeps_the_headroom_preflight_warns_at():
    """Where memory, not the batch, bounds the row (64 samples per step): the largest capacity within memory.TIGHT
    of the card, one step larger is past it; a longer sequence steps it down the same way."""
    for extra in (["train.global_batch_size=64"], ["train.global_batch_size=64", "train.seq_length=8192"]):
        run, res = placed(*H1, *extra)
        limit = memory.TIGHT * run.hardware.memory_gib
        assert memory.estimate(run, res).total <= limit
        bigger = compose([*H1, *extra, "parallelism=3d", "kernels=fast", "kernels.vit_attention_head_dim=128",
                          "kernels.wgrad_fusion=true", "kernels.vit_host_grid=true",
                          f"data.packing={res.packing_capacity + defaults.PACK_STEP}"])
        assert memory.estimate(bigger, resolving.resolve(bigger)).total > limit


def test_one_h100_settles_a_layout_that_fits_with_headroom(tmp_path):
    """H1 on one H100 (80 GiB): no row fits beside Adam's 12-byte state and the padded ViT heads, so the defaults
    turn on the precision-aware optimizer (exact) and unpad the heads, each recorded with why, and pack smaller
    rows; the estimate keeps preflight's headroom and preflight refuses nothing."""
    run, res = placed(*H1[:-2], "hardware=h100", "gpus_per_node=1", tmp=str(tmp_path))
    auto = {a.option: a for a in res.auto}
    assert run.precision.precision_aware_optimizer and auto["precision.precision_aware_optimizer"].value == "true"
    assert run.kernels.vit_attention_head_dim is None and auto["kernels.vit_attention_head_dim"].value == "off"
    assert "h100" in auto["precision.precision_aware_optimizer"].why
    assert res.packing_capacity and memory.estimate(run, res).total <= memory.TIGHT * run.hardware.memory_gib
    findings = preflight.check(run, res)
    assert not preflight.errors(findings) and "memory_headroom" not in {f.rule for f in findings}
    assert "kernels.vit_attention_head_dim" in left_off(run, res)
    # a preset names its row: nothing is relieved behind its back, preflight judges what it names
    run, res = placed("experiment=perf_h200_best")
    assert not run.precision.precision_aware_optimizer and run.kernels.vit_attention_head_dim == 128


def test_exported_photos_fill_more_rows_than_a_step(tmp_path):
    """`vlmtrain data export --format jsonl` of the 16 photos, trained with the overrides it prints: on the declared
    8 GPUs and on one, an epoch fills more rows than one step takes (no step repeats one packed row), and
    preflight, counting the same rows, refuses nothing."""
    manifest = export("jsonl", tmp_path / "photos")
    for world in ([], ["gpus_per_node=1"]):
        run, res = placed(*manifest["overrides"], *world, tmp=str(tmp_path / "run"))
        epoch = prepare.lengths(run).rows(res.packing_capacity, res.pack_align)[0]
        assert epoch > run.train.global_batch_size, (world, res.packing_capacity, epoch)
        assert not preflight.errors(preflight.check(run, res))


@pytest.mark.parametrize("data", ["photos", "realistic"])
def test_no_packed_row_holds_more_than_one_gpus_share_of_a_step(tmp_path, data):
    """A row holds at most train.global_batch_size / DP samples (the fullest of the data stage's bins, not their
    mean): on the exported 16 photos rows of 15 and 1 samples had alternated steps of 15 and 1."""
    source = export("jsonl", tmp_path / "photos")["overrides"] if data == "photos" else H1[:3]
    run, res = placed(*source, "gpus_per_node=1", tmp=str(tmp_path / "run"))
    assert res.packing_capacity
    assert prepare.lengths(run).fullest(res.packing_capacity, res.pack_align) <= 8


def test_h1_validation_on_the_defaults_fills_an_evaluation_batch(tmp_path):
    """The settled row packs the held-out 5 % into at least one evaluation batch, as the data stage bins them; a
    row set by hand that cannot is refused by preflight, counting packed rows, before the data stage."""
    val = ["data.validation_fraction=0.05", "train.eval_interval=10"]
    run, res = placed(*H1, *val, tmp=str(tmp_path / "auto"))
    assert not preflight.errors(preflight.check(run, res))
    assert prepare.lengths(run).rows(res.packing_capacity, res.pack_align)[1] >= eval_global_batch_size(run)
    assert prepare.prepare(run, res).validation_bins is not None  # the data stage accepts it
    run, res = placed(*H1, *val, "data.packing=12288", tmp=str(tmp_path / "hand"))
    found = {f.rule: f.message for f in preflight.errors(preflight.check(run, res))}
    assert "holds out 13 samples, which pack into 1 rows of <= 12288 tokens" in found["validation_fills_eval_batch"]


@pytest.mark.parametrize("hardware", ["h200", "h100", "b200"])
def test_the_same_command_trains_about_the_same_samples_per_step_on_every_card(hardware):
    """train.global_batch_size=8 is 8 samples per step where packing stays off (B200) and about 8 where the
    defaults pack (H200, H100: the rows that carry as many), where a packed GBS counting rows trained ~13x more;
    the plan says how many."""
    run, res = placed(*H1[:-2], f"hardware={hardware}", "gpus_per_node=1")
    lengths = prepare.lengths(run)
    per_step = run.train.global_batch_size * len(lengths.train) / lengths.rows(res.packing_capacity, res.pack_align)[0]
    assert 0.75 * 8 <= per_step <= 1.25 * 8, (hardware, res.packing_capacity, run.train.global_batch_size)
    text = plan.batch_text(run, res)
    assert text.startswith(f"~{per_step:.1f} samples per step" if res.packing_capacity else "8 samples per step")
    best, res = placed("experiment=perf_h200_best")  # a row set by hand: GBS counts rows, as in Megatron
    assert "4 packed row(s)" in plan.batch_text(best, res) and "counts rows (data.packing set)" in plan.batch_text(
        best, res)


def test_more_gpus_keep_fsdp_and_say_what_it_leaves_off(bridge, tmp_path):
    run, res = placed("model=tiny", "data=realistic", "gpus_per_node=8", "train.global_batch_size=64",
                      tmp=str(tmp_path))
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
    assert res.packing_capacity is None and "QWEN35_PACKING_PROVEN" in off["packing"]
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
    (["gpus_per_node=8"], "1 sample(s) per GPU per step"),  # GBS 8 over DP 8: a packed row would hold more
    (["data.payload.num_samples=6", "gpus_per_node=1"], "6 training samples are fewer than one step's"),
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


CLUSTER = {
    "b200x16": ["hardware=b200", "gpus_per_node=8", "nodes=2"],
    "gb200x16": ["hardware=gb200", "nodes=4"],
    "h200x16": ["hardware=h200", "nodes=2"],
    "h100x32": ["hardware=h100", "gpus_per_node=8", "nodes=4"],
    "gb200x64": ["hardware=gb200", "nodes=16"],
}
"""The first cluster runs a new user tries: each model with data=realistic and the world, nothing else."""


@pytest.mark.parametrize("model", ["qwen3_vl_30b_a3b", "qwen35_vl_35b_a3b"])
@pytest.mark.parametrize("world", CLUSTER, ids=list(CLUSTER))
def test_an_unset_global_batch_is_settled_from_the_world(model, world):
    """Left unset, train.global_batch_size is 8 samples per step raised to one micro-batch per data-parallel rank,
    and preflight finds nothing to warn of or refuse: only what the defaults left off (info)."""
    run, res = placed(f"model={model}", "data=realistic", *CLUSTER[world])
    dp = res.layout.dp
    assert dp >= 16 and run.train.global_batch_size == max(8, dp) and res.grad_accum == 1
    auto = {a.option: a for a in res.auto}
    assert f"x DP = 1 x {dp} at or above it" in auto["train.global_batch_size"].why
    findings = preflight.check(run, res)
    assert {f.severity for f in findings} <= {preflight.Severity.info}, [str(f) for f in findings]
    assert plan.batch_text(run, res).startswith(f"{dp} samples per step (train.global_batch_size unset: 8 samples "
                                                f"per step, raised to {dp}")


def test_a_set_global_batch_is_kept_and_refused_where_it_does_not_divide():
    run, res = placed("model=qwen3_vl_30b_a3b", "data=realistic", *CLUSTER["gb200x16"], "train.global_batch_size=8")
    assert run.train.global_batch_size == 8 and "train.global_batch_size" not in {a.option for a in res.auto}
    found = {f.rule: f.message for f in preflight.errors(preflight.check(run, res))}
    assert "train.global_batch_size=8 is not a multiple of micro_batch_size x DP = 1 x 16" in found[
        "global_batch_divisible"]
    run, res = placed("experiment=fsdp_first_gb200")  # a preset's batch is its own
    assert run.train.global_batch_size == 256 and "train.global_batch_size" not in {a.option for a in res.auto}


def test_one_gpu_still_trains_eight_samples_per_step():
    run, res = placed("model=tiny", "gpus_per_node=1", "data.packing=false")
    assert run.train.global_batch_size == 8 and res.grad_accum == 8
    assert plan.batch_text(run, res) == "8 samples per step (train.global_batch_size unset: 8 samples per step)"


def test_qwen3_vl_235b_fits_64_gb200_with_the_defaults():
    """The defaults relieve memory (recompute, the cheapest first) until the estimate keeps preflight's headroom;
    they never freeze a tower, and every relief is recorded with why."""
    run, res = placed("model=qwen3_vl_235b_a22b", "data=realistic", *CLUSTER["gb200x64"])
    assert memory.estimate(run, res).total <= memory.TIGHT * run.hardware.memory_gib
    assert {f.severity for f in preflight.check(run, res)} <= {preflight.Severity.info}
    assert not run.vision.freeze_vision_model and not run.vision.freeze_vision_projection
    auto = {a.option: a.value for a in res.auto}
    assert auto["recompute"] == "selective" and run.recompute.granularity == "selective"
    assert run.parallelism.kind == "fsdp" and res.layout.ep == 64  # EP spans the nodes


def test_qwen3_vl_235b_below_its_least_world_names_it_and_nothing_in_effect():
    """Refused at 16 GB200 after every relief: one message naming the least GB200 world that fits (which does),
    and no override that is already in effect."""
    run, res = placed("model=qwen3_vl_235b_a22b", "data=realistic", *CLUSTER["gb200x16"])
    found = {f.rule: f.message for f in preflight.errors(preflight.check(run, res))}
    msg = found["memory_fits"]
    assert "\n" not in msg and "it needs at least 32 x gb200 (nodes=8 gpus_per_node=4)" in msg
    advice = msg.split(". Try ")[1]
    tries = advice.split(". Model state")[0]
    assert "parallelism=fsdp" not in advice and "recompute=selective" not in tries and "optimizer" not in tries
    assert "recompute=full with vision=frozen_with_projector" in tries  # vision is the user's to freeze
    bigger, res = placed("model=qwen3_vl_235b_a22b", "data=realistic", "hardware=gb200", "nodes=8")
    assert not preflight.errors(preflight.check(bigger, res))


def test_the_qwen35_preset_is_what_the_plan_ranks_first_and_fits(tmp_path):
    """experiment=perf_h200_qwen35 was chosen by the plan before any run: it fits the card without preflight.ignore
    and the step-time model predicts it faster than H2's defaults on the same card (fewer micro-batches)."""
    from vlmtrain.check import speed

    best, best_res = placed("experiment=perf_h200_qwen35", tmp=str(tmp_path))
    user, user_res = placed("model=qwen35_vl_35b_a3b", "model.num_layers=4", "data=realistic", "hardware=h200",
                            "gpus_per_node=1", "train.seq_length=4096", tmp=str(tmp_path))
    assert not best.preflight.ignore
    assert memory.estimate(best, best_res).total <= memory.TIGHT * best.hardware.memory_gib
    assert not preflight.errors(preflight.check(best, best_res))
    assert best_res.grad_accum < user_res.grad_accum
    assert speed.predicted(best, best_res).step_s < speed.predicted(user, user_res).step_s
