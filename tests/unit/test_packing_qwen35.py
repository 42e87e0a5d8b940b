"""Qwen3.5 packing on CPU, what the GPU check (vlmtrain.lab.checks.packing_equivalence's qwen35 cases) builds on:
packed tiny_qwen35 rows reach Megatron Core's GatedDeltaNet with one cu_seqlens boundary per sample (its own
_resolve_cu_seqlens, the boundaries FLA's varlen conv1d and chunked delta rule reset their state at), the Gated
DeltaNet control's input drops them, the verdict counts that control, and preflight refuses until the proof passed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from packed_batches import MICRO_BATCHES, Data, PackedBatch, case_builder, data_builder

from vlmtrain.check import preflight
from vlmtrain.check.preflight import packing
from vlmtrain.config import architecture as arch
from vlmtrain.config.resolve import resolve
from vlmtrain.lab.checks import packing_equivalence
from vlmtrain.lab.checks.packing_gdn_control import gdn_whole_row, without_packing
from vlmtrain.lab.checks.packing_verdict import CONTROL_MARGIN, ROUNDING_MARGIN, verdict

QWEN35 = ("model=tiny_qwen35", "preflight.ignore=[qwen35_packing_unverified]")  # the proof's own batches


@pytest.fixture(scope="module")
def data(compose: Callable[..., Any], bridge: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Data]:
    return data_builder(lambda *o, **k: compose(*QWEN35, *o, **k), tmp_path_factory)


@pytest.fixture(scope="module")
def case(data: Callable[..., Data]) -> Callable[..., PackedBatch]:
    return case_builder(data)


def test_tiny_qwen35_is_the_published_pattern(compose: Callable[..., Any]) -> None:
    m = compose("model=tiny_qwen35").model
    assert arch.layer_types(m) == ["linear_attention"] * 3 + ["full_attention"]
    assert sum(m.mrope_section) == m.head_dim * arch.QWEN35_PARTIAL_ROTARY_FACTOR / 2


@pytest.mark.parametrize(("multiple", "static"), [(1, False), (16, False), (1, True)])
@pytest.mark.parametrize("name", sorted(MICRO_BATCHES))
def test_gdn_gets_one_boundary_per_sample(case: Callable[..., PackedBatch], multiple: int, static: bool,
                                          name: str) -> None:
    """What vlm_step hands the model: GDN resolves the params to each sample's (padded) start and the row's end,
    and every sample's real tokens lie inside its own segment, so no conv window or state spans two samples."""
    from megatron.core.ssm.gated_delta_net.gdn import GatedDeltaNet

    c = case(multiple, name, static)
    total = c.step["input_ids"].shape[1]
    p = c.packed_seq_params
    assert p.qkv_format == "thd"
    cu = GatedDeltaNet._resolve_cu_seqlens(None, p.cu_seqlens_q_padded, p.cu_seqlens_q, total, "cu_seqlens_q")
    slices = c.slices()
    assert cu.tolist() == [s for s, _, _ in slices] + [total]
    assert all(start <= real <= end for start, real, end in slices)
    assert len(slices) == len(MICRO_BATCHES[name]) == len(c.alone)


def test_gdn_control_drops_the_boundaries() -> None:
    """The control's forward gets no packed params whatever the layer passes; a model without GDN is refused."""
    seen: list[Any] = []
    forward = without_packing(lambda x, **kw: seen.append(kw["packed_seq_params"]) or x)
    assert forward(1, packed_seq_params="thd params", attention_mask=None) == 1 and seen == [None]
    with pytest.raises(ValueError, match="without GatedDeltaNet"), gdn_whole_row(torch.nn.Linear(2, 2)):
        pass


def _state(steps: int, ce: float, gdn: float, floor: float = 0.001) -> dict[str, Any]:
    return {"trained_steps": steps, "ce_mean_abs_diff_nats": ce, "ce_mean_abs_diff_nats_later_samples": ce,
            "ce_p99_abs_diff_nats": 0.03, "grad_cosine": 0.999, "control_ce_mean_abs_diff_nats_positions": 0.2,
            "control_ce_mean_abs_diff_nats_boundaries": 0.3, "control_ce_mean_abs_diff_nats_gdn_boundaries": gdn,
            "check_ce_mean_abs_diff_nats_whole_row_positions": floor}


def test_verdict_judges_each_state_against_its_own_rounding_floor() -> None:
    """The comparison may be ROUNDING_MARGIN x the state's rounding-only difference; a control must miss that by
    CONTROL_MARGIN at a state where the comparison passes (both from the state's own measurements)."""
    accepted = ROUNDING_MARGIN * 0.001
    bar = CONTROL_MARGIN * accepted
    weak = verdict([_state(0, 0.001, bar * 0.9)])
    assert weak["comparison_ok"] and not weak["control_gdn_boundaries_ok"] and not weak["passed"]
    later = verdict([_state(0, 0.001, bar * 0.9), _state(40, 0.0, bar)])
    assert later["control_gdn_boundaries_ok"] and later["control_gdn_boundaries_strong_at_trained_steps"] == 40
    assert later["passed"]
    failing = verdict([_state(0, accepted * 1.1, 1.0)])  # within the fixed 0.01 nats, but 3.3x the rounding floor
    assert failing["comparison_ok"] is False and not failing["control_gdn_boundaries_ok"]
    noisy = verdict([_state(0, 0.0, bar, floor=0.002)])  # the same control at a noisier state is weak
    assert not noisy["control_gdn_boundaries_ok"]
    assert verdict([_state(0, 0.02, 1.0, floor=0.01)])["comparison_ok"] is False  # the fixed tolerance still holds
    assert "control_gdn_boundaries_ok" not in verdict([{k: v for k, v in _state(0, 0.0, 1.0).items()
                                                        if "gdn" not in k}])


def test_preflight_refuses_until_the_proof_passed(compose: Callable[..., Any],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    run = compose("model=tiny_qwen35", "data=realistic", "data.packing=8192", "gpus_per_node=1")
    assert "qwen35_packing_unverified" in {f.rule for f in preflight.errors(preflight.check(run, resolve(run)))}
    monkeypatch.setattr(packing, "QWEN35_PACKING_PROVEN", "machine run X (commit Y)")
    assert packing.qwen35_packing_unverified(run, resolve(run)) is None


QWEN35_CASES = [c for c in packing_equivalence.CASES if "qwen35" in c.name or c.name.startswith("h2")]


@pytest.mark.parametrize("case", QWEN35_CASES, ids=lambda c: c.name)
def test_qwen35_cases_compose_past_preflight(compose: Callable[..., Any], case: Any) -> None:
    run = compose(*case.overrides)  # the harness packs, not the run
    assert run.model.family == "qwen35_vl"
    assert not preflight.errors(preflight.check(run, resolve(run)))


def test_driver_rewrites_its_row_after_each_state(tmp_path: Any) -> None:
    """A case's row is written after every state the rank measures, in place of the one it wrote before, beside
    other rows: a driver killed mid-case leaves one row holding every state so far (complete: false)."""
    import json

    results, result = tmp_path / "packing_equivalence.jsonl", tmp_path / "equivalence.json"
    results.write_text(json.dumps({"name": "earlier"}) + "\n")
    at = results.stat().st_size
    args = ("tiny-qwen35_kernels-default", "cmd", "abc1234", ["model=tiny_qwen35"], result)
    packing_equivalence._write(results, at, *args, rc=None)  # the rank has measured nothing yet
    for n in (1, 2):
        history = [_state(40 * i, 0.0, 0.01) for i in range(n)]
        result.write_text(json.dumps({"metrics": {"trained_steps": history[-1]["trained_steps"], **verdict(history)},
                                      "history": history}))
        packing_equivalence._write(results, at, *args, rc=None)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["name"] for r in rows] == ["earlier", "packing-equivalence_tiny-qwen35_kernels-default"]
    assert len(rows[1]["history"]) == 2 and rows[1]["complete"] is False and rows[1]["metrics"]["rc"] is None
    final = packing_equivalence._write(results, at, *args, rc=0)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == 2 and rows[1]["complete"] is True and final["rc"] == 0 and final["passed"]


def test_gradient_parts_name_the_layer_and_module() -> None:
    """The per-part gradient cosine groups Megatron's parameter names by tower, layer and module."""
    from vlmtrain.lab.checks.packing_harness import part

    assert part("module.vision_model.blocks.3.attn.qkv.weight") == "vision"
    assert part("module.language_model.decoder.layers.0.self_attention.in_proj.weight") == "layer0.self_attention"
    assert part("module.language_model.decoder.layers.1.mlp.experts.linear_fc1.weight3") == "layer1.mlp.experts"
    assert part("module.language_model.decoder.layers.1.mlp.router.weight") == "layer1.mlp.router"
    assert part("module.language_model.embedding.word_embeddings.weight") == "embedding"
    assert part("module.language_model.output_layer.weight") == "output_layer"
