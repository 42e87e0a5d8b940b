"""vlmtrain.check.memory against measurements: the estimates against the peaks of the GPU runs recorded in
tests/fixtures (through vlmtrain.lab.calibrate.memory_check, as its rows are written), the padded ViT attention's
growth and the logits bytes against their measured rows, and the calibration table (no Bridge import)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vlmtrain.check import memory
from vlmtrain.config.resolve import resolve
from vlmtrain.lab.calibrate import memory_check as mc
from vlmtrain.observe import run_summary

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def test_padded_vit_attention_adds_what_the_h1_runs_measured(compose):
    """kernels.vit_attention_head_dim: ViT activations grow by the padded q, k, v and output (nothing at the model's
    own 72); scaled from the worst-case row (every token an image token) to the ~10.5k image tokens of an H1 row,
    the estimate's growth at 128 is within 10 % of what the recorded H1 pair on one machine run measured."""
    from vlmtrain.config import architecture
    from vlmtrain.lab.micro import vit_attention

    h1 = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "gpus_per_node=1", "parallelism=3d",
          "parallelism.ep=1", "data.packing=12288"]
    runs = [compose(*h1, *extra) for extra in
            ([], ["kernels.vit_attention_head_dim=72"], ["kernels.vit_attention_head_dim=128"])]
    plain, own, padded = (memory.estimate(run, resolve(run)) for run in runs)
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
    assert r["machine"] == RECORDED[name]["machine"]  # the measured run's GPU machine, not the one computing it
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
