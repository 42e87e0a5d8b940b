"""vlmtrain.check.memory's arithmetic: exact parameter counts against the H200 runs' checks, sharding, recompute,
freezing, the workload and its padding (read from config.resolve), the preflight rule and the plan section (real
compositions, no Bridge import). The estimates against measured peaks: test_memory_calibration.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vlmtrain.build import plan
from vlmtrain.check import memory, preflight
from vlmtrain.config.resolve import resolve
from vlmtrain.lab.calibrate import memory_check as mc

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
GPU_CASES = FIXTURES / "gpu_cases"
SHAPE_30B = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "train.global_batch_size=8"]
# The one fixture without a case.json (its first attempt failed the CUDA-graph check after training; only its
# re-run has a row); overrides as the gpu_training suite (vlmtrain.lab.cases) built them.
GRAPH_CASE = ["model=tiny", "train.global_batch_size=8", "parallelism=3d", "cuda_graph=moe_router_preprocess",
              "gpus_per_node=1"]


def estimated(run: Any) -> memory.MemoryBreakdown:
    """The estimate of a composed run on its resolved values, as preflight and the plan compute it."""
    return memory.estimate(run, resolve(run))


def _case_overrides() -> dict[str, list[str]]:
    return {d.name: mc.overrides(json.loads((d / "case.json").read_text())["command"])
            if (d / "case.json").exists() else GRAPH_CASE for d in sorted(GPU_CASES.iterdir())}


# --- parameters ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "overrides"), sorted(_case_overrides().items()))
def test_param_counts_match_the_gpu_checks_exactly(compose, case, overrides):
    """1-GPU runs hold every parameter; EP2 ranks half the experts; TP2 the split matrices; PP2's last rank (the
    one that wrote checks.json) the last stage."""
    checks = json.loads((GPU_CASES / case / "checks.json").read_text())
    run = compose(*overrides)
    assert memory.param_counts(run, resolve(run)) == checks["params"]


def test_full_models_have_their_published_sizes(compose):
    """Qwen3-VL-30B-A3B ~31.1 B, Qwen3-VL-235B-A22B ~236 B, Qwen3.5-35B-A3B ~35 B (names / model cards), 1 %."""
    for name, published in (("qwen3_vl_30b_a3b", 31.1e9), ("qwen3_vl_235b_a22b", 236e9), ("qwen35_vl_35b_a3b", 35e9)):
        n = memory.model_param_count(compose(f"model={name}"))
        assert abs(n / published - 1) < 0.01, (name, n)


def test_qwen35_layers_alternate_gated_deltanet_and_attention(compose):
    run = compose("model=qwen35_vl_35b_a3b", "model.num_layers=4", "gpus_per_node=1")
    lay = resolve(run).layout
    sizes = [memory.layer_params(run.model, lay, i)[0] for i in range(4)]
    assert sizes[0] == sizes[1] == sizes[2] != sizes[3]  # 3 Gated-DeltaNet layers, then full attention


def test_one_h200_fits_the_235b_shapes_at_one_decoder_layer_only(compose):
    """What fits on 1 x H200 (FSDP, data=realistic, MBS 1, seq 4096 worst case): the 235B shapes at 1 decoder layer
    (deepstack cut to the layer kept, as preflight asks) with margin, at 2 only tightly, at 3 not at all (its model
    state alone exceeds the GPU); the 30B and Qwen3.5 shapes at 4 layers."""
    def fraction(*overrides: str) -> float:
        run = compose(*overrides, "data=realistic", "gpus_per_node=1")
        assert run.hardware.name == "h200"
        return estimated(run).total / run.hardware.memory_gib

    b235 = "model=qwen3_vl_235b_a22b"
    assert fraction(b235, "model.num_layers=1", "model.vit.deepstack_indexes=[8]") < 110 / 141
    assert 0.9 < fraction(b235, "model.num_layers=2", "model.vit.deepstack_indexes=[8,16]") <= 1.0
    assert fraction(b235, "model.num_layers=3") > 1.0
    assert fraction("model=qwen3_vl_30b_a3b", "model.num_layers=4") < 110 / 141
    assert fraction("model=qwen35_vl_35b_a3b", "model.num_layers=4") < 110 / 141


# --- sharding, recompute, freezing -----------------------------------------------------------------------------


def _state_gib(run: Any, sp: memory.StageParams) -> float:
    params, grads, optimizer, _ = memory.model_state_bytes(run, resolve(run).layout, sp)
    return (params + grads + optimizer) / memory.GIB


def test_fsdp_ep2_holds_half_the_expert_state_of_ep1(compose):
    ep1, ep2 = compose(*SHAPE_30B, "gpus_per_node=1"), compose(*SHAPE_30B, "gpus_per_node=2")
    assert (resolve(ep1).layout.ep, resolve(ep2).layout.ep) == (1, 2)
    experts = [memory.stage_params(r, resolve(r), 0).decoder_expert for r in (ep1, ep2)]
    assert experts[1] * 2 == experts[0]
    only = [memory.StageParams(0, 0, 0, e) for e in experts]
    assert _state_gib(ep2, only[1]) == pytest.approx(_state_gib(ep1, only[0]) / 2)
    # FSDP also shards the dense part over DP=2, so the whole per-GPU model state halves
    b1, b2 = estimated(ep1), estimated(ep2)
    assert b2.params + b2.grads + b2.optimizer == pytest.approx((b1.params + b1.grads + b1.optimizer) / 2)


def test_3d_replicates_params_and_grads_and_shards_the_optimizer(compose):
    one, two = compose(*SHAPE_30B, "parallelism=3d", "gpus_per_node=1"), compose(*SHAPE_30B, "parallelism=3d",
                                                                                 "gpus_per_node=2")
    dense = [memory.stage_params(r, resolve(r), 0) for r in (one, two)]
    dense = [memory.StageParams(d.vision, d.projector, d.decoder_dense, 0) for d in dense]
    p1, g1, o1, _ = memory.model_state_bytes(one, resolve(one).layout, dense[0])
    p2, g2, o2, _ = memory.model_state_bytes(two, resolve(two).layout, dense[1])
    assert (p2, g2) == (p1, g1)
    assert o2 == pytest.approx(o1 / 2)


def _activations(b: memory.MemoryBreakdown) -> float:
    return b.decoder_activations + b.vision_activations


def test_recompute_full_lowers_activations(compose):
    padded = [*SHAPE_30B, "gpus_per_node=2"]
    none, selective, full = (estimated(compose(*padded, f"recompute={r}")) for r in ("none", "selective", "full"))
    assert _activations(full) < _activations(selective) < _activations(none)
    assert full.allocated < none.allocated
    assert full.logits == none.logits  # recompute does not touch the loss buffers


@pytest.mark.parametrize(("precision", "saved_bytes"), [(["precision=bf16"], 2), (["precision=fp8"], 0)])
def test_precision_aware_optimizer_keeps_remainders_for_bf16_weights(compose, precision, saved_bytes):
    """BF16 weight + 16-bit remainder instead of an FP32 master copy, where Megatron stores remainders."""
    off = compose(*SHAPE_30B, "gpus_per_node=1", *precision)
    on = compose(*SHAPE_30B, "gpus_per_node=1", *precision, "precision.precision_aware_optimizer=true")
    trainable = sum(c["trainable"] for c in memory.param_counts(off, resolve(off)).values())
    saved = estimated(off).optimizer - estimated(on).optimizer
    assert saved == pytest.approx(trainable * saved_bytes / memory.GIB)
    assert memory.optimizer_bytes(on) == memory.OPTIMIZER_BYTES - saved_bytes


def test_frozen_vision_lowers_grads_and_optimizer_by_its_parameters(compose):
    trainable, frozen = compose(*SHAPE_30B, "gpus_per_node=1"), compose(*SHAPE_30B, "gpus_per_node=1", "vision=frozen")
    vit = memory.param_counts(trainable, resolve(trainable))["vision"]["trainable"]
    bt, bf = estimated(trainable), estimated(frozen)
    saved = (bt.grads + bt.optimizer) - (bf.grads + bf.optimizer)
    assert saved == pytest.approx(vit * (memory.GRAD_BYTES + memory.OPTIMIZER_BYTES) / memory.GIB)
    assert bf.params == bt.params  # frozen weights still sit on the GPU
    assert bf.vision_activations < bt.vision_activations


def test_pipeline_peak_is_the_worst_stage(compose):
    run = compose("model=tiny", "parallelism=3d", "parallelism.pp=2", "parallelism.ep=1", "gpus_per_node=2")
    b = estimated(run)
    assert (b.stage, b.vision_activations) == (1, 0.0) and b.logits > 0  # the last stage holds the logits


def test_phases_add_up(compose):
    b = estimated(compose(*SHAPE_30B, "gpus_per_node=1", "vision=frozen"))
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
    res = resolve(run)
    assert res.padded is pads and memory.default_workload(run, res).padded is pads
    assert (StepCounters(run, res, nullcontext).padded_length(100) == run.train.seq_length) is pads
    assert memory.default_workload(run, res).seq_len == run.train.seq_length  # unpadded: the worst case


def test_image_token_bounds_follow_the_data_group(compose):
    def bound(*overrides: str) -> int:
        run = compose(*overrides)
        return memory.image_token_bound(run, resolve(run))

    assert bound("data=mock") == 196  # 256x256 is resized up to the collate minimum
    assert bound("data=realistic") == 3 * 980
    assert bound("data=sample") == 980
    assert bound("data=hf", "data.path=cord_v2") == 4096


# --- preflight and plan ----------------------------------------------------------------------------------------


def findings(run: Any) -> list[preflight.Finding]:
    return preflight.check(run, resolve(run))


def test_rule_trips_when_the_model_cannot_fit(compose):
    found = {f.rule: f for f in findings(compose("model=qwen3_vl_235b_a22b", "hardware=h100"))}
    f = found["memory_fits"]
    assert f.severity == preflight.Severity.error
    for words in ("model=qwen3_vl_235b_a22b", "parallelism=fsdp", "recompute=none", "train.micro_batch_size=1",
                  "recompute=selective", "recompute=full", "hardware=h100", "More GPUs alone will not do"):
        assert words in f.message
    assert "parallelism.ep" not in f.message  # EP already spans the 8 GPUs: only more of them shard it


def test_rule_passes_the_default_tiny_config(compose):
    assert not [f for f in findings(compose()) if f.rule.startswith("memory")]


def test_rule_warns_above_90_percent(compose):
    run = compose("model=qwen3_vl_30b_a3b", "hardware=h100", "recompute=full")
    assert 0.9 < estimated(run).total / run.hardware.memory_gib <= 1.0
    found = {f.rule: f.severity for f in findings(run) if f.rule.startswith("memory")}
    assert found == {"memory_headroom": preflight.Severity.warning}


def test_rule_is_cheap_no_bridge_or_torch_import():
    code = ("import sys; from vlmtrain.config.compose import compose; from vlmtrain.check import preflight; "
            "from vlmtrain.config.resolve import resolve; run = compose(['model=qwen3_vl_235b_a22b']); "
            "preflight.check(run, resolve(run)); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('megatron', 'torch', 'transformer_engine')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stdout


def test_plan_shows_the_memory_section(compose):
    def rendered(*overrides: str) -> str:
        run = compose(*overrides)
        return plan.render(run, resolve(run), None, [], "n/a")

    text = rendered("model=qwen3_vl_235b_a22b", "hardware=h100")
    assert "memory:" in text and "headroom" in text and "DOES NOT FIT" in text
    assert "fits" in rendered().split("memory:")[1]
    packed = rendered("experiment=perf_h200x2_best").split("memory:")[1]
    assert "1 packed row x seq 12288" in packed and "12288 image tokens/row" in packed and "tight" in packed


def test_estimate_reads_the_capacity(compose):
    """A packed run's micro-batch is one row of the capacity: the estimate's sequence is the capacity (not
    train.micro_batch_size x train.seq_length), its activations grow with it, and a static row counts as padded."""
    base = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "gpus_per_node=1"]
    small, big = (estimated(compose(*base, f"data.packing={c}")) for c in (4096, 8192))
    assert (small.seq_len, big.seq_len) == (4096, 8192) and not small.padded
    assert big.decoder_activations == pytest.approx(2 * small.decoder_activations)
    assert big.logits == pytest.approx(2 * small.logits) and big.vision_activations > small.vision_activations
    unpacked = estimated(compose(*base, "train.seq_length=4096"))
    assert small.decoder_activations == pytest.approx(unpacked.decoder_activations)  # MBS 1 x 4096 either way
    assert estimated(compose(*base, "data.packing=4096", "data.packing_static=true")).padded
    assert not resolve(compose("gpus_per_node=2", "data.packing=8192")).padded  # EP2, but packed: real tokens
    assert resolve(compose("gpus_per_node=2", "data.packing=8192", "data.packing_static=true")).padded
