"""The precision group against Bridge's own mixed-precision recipes, the dry run on Blackwell, the MFU peaks, the
report's per-precision sections and the memory estimate, the last two on the runs recorded on 1x H200."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlmtrain import report
from vlmtrain.build import container, target
from vlmtrain.check import memory
from vlmtrain.config.groups import precision
from vlmtrain.config.resolve import resolve
from vlmtrain.observe import run_summary

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "precision_h200"


@pytest.mark.parametrize(("fmt", "scaling"), sorted(precision.RECIPES, key=str))
def test_each_option_names_the_bridge_recipe_it_means(bridge, fmt, scaling):
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    name = precision.RECIPES[(fmt, scaling)]
    mp = get_mixed_precision_config(name)
    want = {precision.Format.bf16: (None, None), precision.Format.mxfp8: ("mxfp8", None),
            precision.Format.nvfp4: (None, "nvfp4")}.get(fmt, (str(scaling), None))
    assert (mp.fp8_recipe if mp.fp8 else None, mp.fp4_recipe if mp.fp4 else None) == want
    keeps_bf16_weights = (mp.fp8 or mp.fp4) and not (mp.fp8_param_gather or mp.fp4_param_gather)
    assert (name in precision.RECIPES_WITHOUT_QUANTIZED_PARAMS) == bool(keeps_bf16_weights)
    bf16_layers = ((mp.num_layers_at_start_in_bf16, mp.num_layers_at_end_in_bf16) if mp.first_last_layers_bf16
                   else (0, 0))
    assert precision.RECIPE_BF16_LAYERS.get(name, (0, 0)) == bf16_layers


def test_fp8_container_keeps_vision_and_router_out_of_fp8(compose, bridge):
    run = compose("model=qwen3_vl_30b_a3b", "precision=fp8", "precision.bf16_layers_at_start=0",
                  "precision.bf16_layers_at_end=2")
    cfg = container.build(run, resolve(run))
    target.finalize(run, resolve(run), cfg)
    mp = cfg.mixed_precision
    assert (mp.fp8, mp.fp8_recipe, mp.num_layers_at_start_in_bf16, mp.num_layers_at_end_in_bf16) == (
        "hybrid", "tensorwise", 0, 2)
    assert cfg.model.fp8 == "hybrid" and cfg.model.moe_router_dtype == "fp32"
    assert cfg.model.moe_router_padding_for_quantization
    assert precision.replacements(run) == []  # the ViT stays BF16 unless precision.vision=quantized
    assert precision.replacements(compose("precision=fp8", "precision.vision=quantized")) == ["vit_quantized"]


@pytest.mark.parametrize("hardware", ["gb200", "b200"])
def test_dry_run_validates_mxfp8_on_blackwell_with_bridge(compose, bridge, hardware):
    run = compose(f"hardware={hardware}", "precision=mxfp8")
    cfg = container.build(run, resolve(run))
    target.finalize(run, resolve(run), cfg)  # Bridge's runtime_config_update, as on the declared target
    assert cfg.model.fp8_recipe == "mxfp8"
    assert cfg.ddp.reuse_grad_buf_for_mxfp8_param_ag is False  # Bridge turns it off under Megatron-FSDP


def test_mfu_peaks_per_precision(compose):
    assert precision.peak_tflops(compose("precision=fp8")) == 1979.0
    assert precision.peak_tflops(compose("precision=bf16")) == 989.0
    assert precision.peak_tflops(compose("hardware=gb200", "precision=nvfp4")) == 10000.0
    assert precision.peak_tflops(compose("hardware=b200", "precision=mxfp8")) == 4500.0


def test_recorded_runs_carry_precision_and_both_mfus():
    rows = {d.name: run_summary.read_jsonl(d / "metrics.jsonl")[-1] for d in RECORDED.iterdir()}
    assert {n: r["precision"] for n, r in rows.items()} == {
        "bf16-0": "bf16", "fp8-tensorwise-0": "fp8-tensorwise", "fp8-blockwise-0": "fp8-blockwise"}
    assert rows["bf16-0"]["mfu_precision_peak"] == rows["bf16-0"]["mfu"]
    fp8 = rows["fp8-tensorwise-0"]
    assert fp8["mfu_precision_peak"] == pytest.approx(fp8["mfu"] * 989.0 / 1979.0)


def test_report_ranks_each_precision_in_its_own_section(tmp_path):
    report.write_report(RECORDED, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "## Ranking: trainable vision, real data\n" in md
    assert "— precision fp8-tensorwise (ranked only against fp8-tensorwise)" in md
    ranks = {line.split(" | ")[1]: line.split(" | ")[0] for line in md.splitlines() if line.startswith("| 1 |")}
    assert set(ranks) == {"bf16-0", "fp8-tensorwise-0"}  # each first in its own table; blockwise stopped at 91/100


def test_memory_estimate_accounts_for_blockwise_fp8_weight_copies(compose):
    base = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "gpus_per_node=1",
            "train.micro_batch_size=1", "train.global_batch_size=1"]
    runs = [compose(*base, *extra)
            for extra in ([], ["precision=fp8"], ["precision=fp8", "precision.scaling=blockwise"])]
    bf16, tensorwise, blockwise = (memory.estimate(run, resolve(run)) for run in runs)
    assert bf16.quantized_weights == tensorwise.quantized_weights == 0.0
    peak = {d.name: run_summary.summarize(d)["peak_mem_gib"] for d in RECORDED.iterdir()}
    measured = peak["fp8-blockwise-0"] - peak["bf16-0"]
    assert blockwise.allocated - bf16.allocated == pytest.approx(measured, rel=0.05)
    assert json.loads((RECORDED / "fp8-blockwise-0" / "case.json").read_text())["rc"] == 124
