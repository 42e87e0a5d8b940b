"""vlmtrain.check.memory: exact parameter counts against the H200 runs' checks, the sharding/recompute/freeze
arithmetic, the preflight rule, the plan section, and the estimates against the peaks of the GPU runs recorded in
tests/fixtures (real compositions, no Bridge import)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vlmtrain.build import plan
from vlmtrain.check import memory, preflight
from vlmtrain.config import world
from vlmtrain.lab.calibrate import memory_check as mc
from vlmtrain.observe import run_summary

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
GPU_CASES = FIXTURES / "gpu_cases"
SHAPE_30B = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "train.global_batch_size=8"]
# The one fixture without a case.json (its first attempt failed the CUDA-graph check after training; only its
# re-run has a row); overrides as vlmtrain.lab.cases built them.
GRAPH_CASE = ["model=tiny", "train.global_batch_size=8", "parallelism=3d", "cuda_graph=moe_router_preprocess",
              "gpus_per_node=1"]


def _case_overrides() -> dict[str, list[str]]:
    return {d.name: mc.overrides(json.loads((d / "case.json").read_text())["command"])
            if (d / "case.json").exists() else GRAPH_CASE for d in sorted(GPU_CASES.iterdir())}


# --- parameters ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "overrides"), sorted(_case_overrides().items()))
def test_param_counts_match_the_gpu_checks_exactly(compose, case, overrides):
    """1-GPU runs hold every parameter; EP2 ranks half the experts; TP2 the split matrices; PP2's last rank (the
    one that wrote checks.json) the last stage."""
    checks = json.loads((GPU_CASES / case / "checks.json").read_text())
    assert memory.param_counts(compose(*overrides)) == checks["params"]


def test_full_models_have_their_published_sizes(compose):
    """Qwen3-VL-30B-A3B ~31.1 B, Qwen3-VL-235B-A22B ~236 B, Qwen3.5-35B-A3B ~35 B (names / model cards), 1 %."""
    for name, published in (("qwen3_vl_30b_a3b", 31.1e9), ("qwen3_vl_235b_a22b", 236e9), ("qwen35_vl_35b_a3b", 35e9)):
        n = memory.model_param_count(compose(f"model={name}"))
        assert abs(n / published - 1) < 0.01, (name, n)


def test_qwen35_layers_alternate_gated_deltanet_and_attention(compose):
    run = compose("model=qwen35_vl_35b_a3b", "model.num_layers=4", "gpus_per_node=1")
    lay = world.layout(run)
    sizes = [memory.layer_params(run.model, lay, i)[0] for i in range(4)]
    assert sizes[0] == sizes[1] == sizes[2] != sizes[3]  # 3 Gated-DeltaNet layers, then full attention


def test_one_h200_fits_the_235b_shapes_at_one_decoder_layer_only(compose):
    """What fits on 1 x H200 (FSDP, data=realistic, MBS 1, seq 4096 worst case): the 235B shapes at 1 decoder layer
    (deepstack cut to the layer kept, as preflight asks) with margin, at 2 only tightly, at 3 not at all (its model
    state alone exceeds the GPU); the 30B and Qwen3.5 shapes at 4 layers."""
    def fraction(*overrides: str) -> float:
        run = compose(*overrides, "data=realistic", "gpus_per_node=1")
        assert run.hardware.name == "h200"
        return memory.estimate(run).total / run.hardware.memory_gib

    b235 = "model=qwen3_vl_235b_a22b"
    assert fraction(b235, "model.num_layers=1", "model.vit.deepstack_indexes=[8]") < 110 / 141
    assert 0.9 < fraction(b235, "model.num_layers=2", "model.vit.deepstack_indexes=[8,16]") <= 1.0
    assert fraction(b235, "model.num_layers=3") > 1.0
    assert fraction("model=qwen3_vl_30b_a3b", "model.num_layers=4") < 110 / 141
    assert fraction("model=qwen35_vl_35b_a3b", "model.num_layers=4") < 110 / 141


# --- sharding, recompute, freezing -----------------------------------------------------------------------------


def _state_gib(run: Any, sp: memory.StageParams) -> float:
    params, grads, optimizer, _ = memory.model_state_bytes(run, world.layout(run), sp)
    return (params + grads + optimizer) / memory.GIB


def test_fsdp_ep2_holds_half_the_expert_state_of_ep1(compose):
    ep1, ep2 = compose(*SHAPE_30B, "gpus_per_node=1"), compose(*SHAPE_30B, "gpus_per_node=2")
    assert (world.layout(ep1).ep, world.layout(ep2).ep) == (1, 2)
    experts = [memory.stage_params(r, world.layout(r), 0).decoder_expert for r in (ep1, ep2)]
    assert experts[1] * 2 == experts[0]
    only = [memory.StageParams(0, 0, 0, e) for e in experts]
    assert _state_gib(ep2, only[1]) == pytest.approx(_state_gib(ep1, only[0]) / 2)
    # FSDP also shards the dense part over DP=2, so the whole per-GPU model state halves
    b1, b2 = memory.estimate(ep1), memory.estimate(ep2)
    assert b2.params + b2.grads + b2.optimizer == pytest.approx((b1.params + b1.grads + b1.optimizer) / 2)


def test_3d_replicates_params_and_grads_and_shards_the_optimizer(compose):
    one, two = compose(*SHAPE_30B, "parallelism=3d", "gpus_per_node=1"), compose(*SHAPE_30B, "parallelism=3d",
                                                                                 "gpus_per_node=2")
    dense = [memory.stage_params(r, world.layout(r), 0) for r in (one, two)]
    dense = [memory.StageParams(d.vision, d.projector, d.decoder_dense, 0) for d in dense]
    p1, g1, o1, _ = memory.model_state_bytes(one, world.layout(one), dense[0])
    p2, g2, o2, _ = memory.model_state_bytes(two, world.layout(two), dense[1])
    assert (p2, g2) == (p1, g1)
    assert o2 == pytest.approx(o1 / 2)


def _activations(b: memory.MemoryBreakdown) -> float:
    return b.decoder_activations + b.vision_activations


def test_recompute_full_lowers_activations(compose):
    padded = [*SHAPE_30B, "gpus_per_node=2"]
    none, selective, full = (memory.estimate(compose(*padded, f"recompute={r}")) for r in ("none", "selective", "full"))
    assert _activations(full) < _activations(selective) < _activations(none)
    assert full.allocated < none.allocated
    assert full.logits == none.logits  # recompute does not touch the loss buffers


@pytest.mark.parametrize(("precision", "saved_bytes"), [(["precision=bf16"], 2), (["precision=fp8"], 0)])
def test_precision_aware_optimizer_keeps_remainders_for_bf16_weights(compose, precision, saved_bytes):
    """BF16 weight + 16-bit remainder instead of an FP32 master copy, where Megatron stores remainders."""
    off = compose(*SHAPE_30B, "gpus_per_node=1", *precision)
    on = compose(*SHAPE_30B, "gpus_per_node=1", *precision, "precision.precision_aware_optimizer=true")
    trainable = sum(c["trainable"] for c in memory.param_counts(off).values())
    saved = memory.estimate(off).optimizer - memory.estimate(on).optimizer
    assert saved == pytest.approx(trainable * saved_bytes / memory.GIB)
    assert memory.optimizer_bytes(on) == memory.OPTIMIZER_BYTES - saved_bytes


def test_frozen_vision_lowers_grads_and_optimizer_by_its_parameters(compose):
    trainable, frozen = compose(*SHAPE_30B, "gpus_per_node=1"), compose(*SHAPE_30B, "gpus_per_node=1", "vision=frozen")
    vit = memory.param_counts(trainable)["vision"]["trainable"]
    bt, bf = memory.estimate(trainable), memory.estimate(frozen)
    saved = (bt.grads + bt.optimizer) - (bf.grads + bf.optimizer)
    assert saved == pytest.approx(vit * (memory.GRAD_BYTES + memory.OPTIMIZER_BYTES) / memory.GIB)
    assert bf.params == bt.params  # frozen weights still sit on the GPU
    assert bf.vision_activations < bt.vision_activations


def test_pipeline_peak_is_the_worst_stage(compose):
    run = compose("model=tiny", "parallelism=3d", "parallelism.pp=2", "parallelism.ep=1", "gpus_per_node=2")
    b = memory.estimate(run)
    assert (b.stage, b.vision_activations) == (1, 0.0) and b.logits > 0  # the last stage holds the logits


def test_phases_add_up(compose):
    b = memory.estimate(compose(*SHAPE_30B, "gpus_per_node=1", "vision=frozen"))
    assert b.allocated == pytest.approx(b.persistent + max(b.activation_phase, b.fsdp_buckets))
    assert b.total == pytest.approx(b.allocated + memory.CONTEXT_OVERHEAD_GIB)


# --- workload --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "pads"), [
    (["gpus_per_node=1"], False),
    (["gpus_per_node=2"], True),  # EP2
    (["parallelism=3d", "parallelism.pp=2", "parallelism.ep=1", "gpus_per_node=2"], True),
    (["gpus_per_node=1", "cuda_graph=moe_router_preprocess", "parallelism=3d"], True),
    (["gpus_per_node=1", "data.pad_to_max_length=true"], True),
])
def test_padding_rule_matches_the_step_counters(compose, overrides, pads):
    from contextlib import nullcontext

    from vlmtrain.train.step_counters import StepCounters

    run = compose(*overrides)
    assert memory.pads(run) is pads
    assert (StepCounters(run, nullcontext).padded_length(100) == run.train.seq_length) is pads
    assert memory.default_workload(run).seq_len == run.train.seq_length  # unpadded: the worst case


def test_image_token_bounds_follow_the_data_group(compose):
    assert memory.image_token_bound(compose("data=mock")) == 196  # 256x256 is resized up to the collate minimum
    assert memory.image_token_bound(compose("data=realistic")) == 3 * 980
    assert memory.image_token_bound(compose("data=sample")) == 980
    assert memory.image_token_bound(compose("data=hf", "data.path=cord_v2")) == 4096


# --- preflight and plan ----------------------------------------------------------------------------------------


def test_rule_trips_when_the_model_cannot_fit(compose):
    findings = {f.rule: f for f in preflight.check(compose("model=qwen3_vl_235b_a22b", "hardware=h100"))}
    f = findings["memory_fits"]
    assert f.severity == preflight.Severity.error
    for words in ("model=qwen3_vl_235b_a22b", "parallelism=fsdp", "recompute=none", "train.micro_batch_size=1",
                  "recompute=full", "parallelism.ep", "hardware=h100"):
        assert words in f.message


def test_rule_passes_the_default_tiny_config(compose):
    assert not [f for f in preflight.check(compose()) if f.rule.startswith("memory")]


def test_rule_warns_above_90_percent(compose):
    run = compose("model=qwen3_vl_30b_a3b", "hardware=h100", "recompute=full")
    assert 0.9 < memory.estimate(run).total / run.hardware.memory_gib <= 1.0
    found = {f.rule: f.severity for f in preflight.check(run) if f.rule.startswith("memory")}
    assert found == {"memory_headroom": preflight.Severity.warning}


def test_rule_is_cheap_no_bridge_or_torch_import():
    code = ("import sys; from vlmtrain.config.compose import compose; from vlmtrain.check import preflight; "
            "preflight.check(compose(['model=qwen3_vl_235b_a22b'])); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('megatron', 'torch', 'transformer_engine')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stdout


def test_plan_shows_the_memory_section(compose):
    text = plan.render(compose("model=qwen3_vl_235b_a22b", "hardware=h100"), None, [], "n/a")
    assert "memory:" in text and "headroom" in text and "DOES NOT FIT" in text
    assert "fits" in plan.render(compose(), None, [], "n/a").split("memory:")[1]
    packed = plan.render(compose("experiment=perf_h200x2_best"), None, [], "n/a").split("memory:")[1]
    assert "1 packed row x seq 12288" in packed and "12288 image tokens/row" in packed and "tight" in packed


def test_estimate_reads_the_capacity(compose):
    """A packed run's micro-batch is one row of the capacity: the estimate's sequence is the capacity (not
    train.micro_batch_size x train.seq_length), its activations grow with it, and a static row counts as padded."""
    base = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "gpus_per_node=1"]
    small, big = (memory.estimate(compose(*base, f"data.packing={c}")) for c in (4096, 8192))
    assert (small.seq_len, big.seq_len) == (4096, 8192) and not small.padded
    assert big.decoder_activations == pytest.approx(2 * small.decoder_activations)
    assert big.logits == pytest.approx(2 * small.logits) and big.vision_activations > small.vision_activations
    unpacked = memory.estimate(compose(*base, "train.seq_length=4096"))
    assert small.decoder_activations == pytest.approx(unpacked.decoder_activations)  # MBS 1 x 4096 either way
    assert memory.estimate(compose(*base, "data.packing=4096", "data.packing_static=true")).padded
    assert not memory.pads(compose("gpus_per_node=2", "data.packing=8192"))  # EP2, but packed: real tokens
    assert memory.pads(compose("gpus_per_node=2", "data.packing=8192", "data.packing_static=true"))


def test_padded_vit_attention_adds_what_the_h1_runs_measured(compose):
    """kernels.vit_attention_head_dim: ViT activations grow by the padded q, k, v and output (nothing at the model's
    own 72); scaled from the worst-case row (every token an image token) to the ~10.5k image tokens of an H1 row,
    the estimate's growth at 128 is within 10 % of what the recorded H1 pair on one machine run measured."""
    from vlmtrain.config import architecture
    from vlmtrain.lab.micro import vit_attention

    h1 = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "gpus_per_node=1", "parallelism=3d",
          "parallelism.ep=1", "data.packing=12288"]
    plain, own, padded = (memory.estimate(compose(*h1, *extra)) for extra in
                          ([], ["kernels.vit_attention_head_dim=72"], ["kernels.vit_attention_head_dim=128"]))
    assert own.allocated == plain.allocated
    grown = padded.vision_activations - plain.vision_activations
    assert padded.decoder_activations == plain.decoder_activations and grown > 0
    rows = {r["name"]: r for r in run_summary.read_jsonl(FIXTURES / "perf_h200" / "rows.jsonl")
            if r.get("machine_run") == "boot-4a774566" and r["name"].endswith("_summary")}
    base = "h1_h200x2-best_3d-ep1_mbs1_packed12288_cg-none_gbs4"
    measured = (rows[f"{base}_vit-attn128_summary"]["metrics"]["peak_mem_gib"]
                - rows[f"{base}_summary"]["metrics"]["peak_mem_gib"])
    row_patches = sum(vit_attention.seqlens())  # an H1 row's images, as the attention benchmark draws them
    assert grown * row_patches / (12288 * architecture.PATCHES_PER_TOKEN) == pytest.approx(measured, rel=0.10)


def test_logits_bytes_are_the_measured_ones():
    """LOGITS_BYTES per cross entropy against vlmtrain.lab.micro.logits_memory's rows (one H1 row through Megatron's own
    native and TE loss calls on an H200), within 1 %."""
    from vlmtrain.check.memory.activations import LOGITS_BYTES
    from vlmtrain.config.groups.kernels import CrossEntropy

    rows = {r["name"]: r["metrics"] for r in run_summary.read_jsonl(FIXTURES / "logits_memory_h200" / "rows.jsonl")}
    assert sorted(rows) == ["logits-memory_native", "logits-memory_te"]
    for impl in CrossEntropy:
        assert LOGITS_BYTES[impl] == pytest.approx(rows[f"logits-memory_{impl}"]["bytes_per_logit"], rel=0.01)


# --- validation against the measured peaks ---------------------------------------------------------------------


KNOWN_MISSES = {"tiny_realistic": 25.0}
"""Recorded runs the estimate misses by more than TARGET_PCT, each erring high and below its bound here:
tiny_realistic (+19.7 %) is estimated at the longest of the 256 realistic rows, of which the run read 64-80."""


def _recorded_runs() -> dict[str, dict[str, Any]]:
    """The rebuildable recorded GPU runs of tests/fixtures as results rows, by fixture name: gpu_acceptance and
    gpu_cases keep their row as case.json; precision_h200's case.json holds command and rc, its peak comes from the
    run's metrics.jsonl (as vlmtrain.lab.checks.precision_parity summarizes it)."""
    runs = {d.parent.name: json.loads(d.read_text())
            for group in ("gpu_acceptance", "gpu_cases") for d in sorted((FIXTURES / group).glob("*/case.json"))}
    for d in sorted((FIXTURES / "precision_h200").glob("*/case.json")):
        meta = json.loads(d.read_text())
        runs[f"precision_h200/{d.parent.name}"] = {
            "name": f"precision_h200/{d.parent.name}", "command": meta["command"], "machine": meta["machine"],
            "metrics": {"rc": meta["rc"], **run_summary.summarize(d.parent)}}
    return {name: r for name, r in runs.items() if mc.rebuildable(r)}


RECORDED = _recorded_runs()


@pytest.fixture(scope="module")
def estimates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """memory_check's row of every recorded run; one pass (~1 min) over each dataset, materialized in a temp dir."""
    tmp = tmp_path_factory.mktemp("memory_check")
    lengths: dict[str, list[tuple[int, int]]] = {}
    return {name: mc.row(r, lengths, tmp / "cache", output_dir=str(tmp / "run")) for name, r in RECORDED.items()}


def test_the_recorded_runs_cover_every_fixture_set():
    assert {n.split("/")[0] for n in RECORDED} >= {"precision_h200"}
    assert {"tiny_realistic", "tiny_sample", "235b-l1_realistic", "qwen35-l4_first-run",
            "tiny_fsdp_ep1_trainable_recompute-none_graph-none_1gpu"} <= RECORDED.keys()
    assert KNOWN_MISSES.keys() <= RECORDED.keys()
    assert not any(mc.rebuildable(json.loads((FIXTURES / "gpu_acceptance" / n / "case.json").read_text()))
                   for n in ("tiny_mock", "tiny_jsonl", "tiny_sweep_mbs", "qwen35-l4_packing_refused"))


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_estimate_is_within_15_percent_of_the_recorded_peak(estimates, name):
    """At the workload the run had, the allocator peak estimate is within 15 % of the measured peak_mem_gib; the
    named known misses err high and stay below their bound."""
    r, measured = estimates[name], RECORDED[name]["metrics"]["peak_mem_gib"]
    m = r["metrics"]
    assert m["measured_gib"] == pytest.approx(measured, abs=1e-3)
    assert m["error_pct"] == pytest.approx(100 * (m["estimated_gib"] - measured) / measured, abs=0.06)
    assert r["within_target"] is (abs(m["error_pct"]) <= mc.TARGET_PCT)
    assert m["worst_case_gib"] >= m["estimated_gib"] - 1e-3  # the default workload bounds the run's own
    assert set(r["breakdown"]) >= {"params", "grads", "optimizer", "logits", "overhead", "allocated", "total"}
    if name in KNOWN_MISSES:
        assert mc.TARGET_PCT < m["error_pct"] < KNOWN_MISSES[name], (name, m)
    else:
        assert abs(m["error_pct"]) <= mc.TARGET_PCT, (name, m)


def _table_row(name: str, measured: float, estimated: float, worst: float, seq: int, images: int,
               padded: bool) -> dict[str, Any]:
    err = mc.error_pct(estimated, measured)
    return {"name": name, "within_target": abs(err) <= mc.TARGET_PCT,
            "metrics": {"measured_gib": measured, "estimated_gib": estimated, "error_pct": err, "worst_case_gib": worst,
                        "worst_case_error_pct": mc.error_pct(worst, measured)},
            "workload": {"seq_len": seq, "image_tokens_per_sample": images, "padded": padded}}


def test_markdown_table_renders_the_rows():
    rows = [_table_row("a", 10.0, 10.5, 12.0, 640, 980, False), _table_row("b", 4.0, 5.0, 3.9, 4096, 2940, True)]
    lines = mc.markdown_table(rows).splitlines()
    assert lines[0].startswith("| case | measured GiB | estimated GiB | error % |") and lines[1].startswith("|---|")
    assert lines[2:] == ["| a | 10.00 | 10.50 | +5.0 | 12.00 (+20.0) | 640, 980 |",
                         "| b | 4.00 | 5.00 | +25.0 **(> 15 %)** | 3.90 (-2.5) | 4096 padded, 2940 |"]
