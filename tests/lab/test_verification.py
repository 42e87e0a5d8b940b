"""The CPU half of issue 47's verification (lab.checks.verification, lab.checks.hf_parity) on tiny checkpoints built
with transformers' own classes: the prompt the parity checks feed, the logits verdict (a wrong weight mapping fails
it), the frozen-weights verdict, the resume verdict and the reload check. The GPU half runs on one H200."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vlmtrain.lab.checks import hf_parity, resume, verification


@pytest.fixture(scope="module", params=["qwen3_vl", "qwen35_vl"])
def checkpoint(request, tiny_checkpoint) -> Path:
    return tiny_checkpoint(request.param)


@pytest.fixture(scope="module")
def batch(checkpoint) -> dict:
    """The two-photo prompt through the checkpoint's processor, built once per checkpoint for every test."""
    return hf_parity.inputs(checkpoint)


@pytest.fixture(scope="module")
def ref32(checkpoint, batch):
    """The checkpoint's own FP32 logits on `batch`: the reference both mapping checks compare against."""
    return cpu_logits(checkpoint, batch)


def cpu_logits(hf_dir: Path, batch: dict, dtype=None):
    import torch
    from transformers import AutoModelForImageTextToText

    dtype = dtype or torch.float32
    model = AutoModelForImageTextToText.from_pretrained(str(hf_dir), dtype=dtype, local_files_only=True)
    with torch.no_grad():
        return model(**batch).logits[0].float()


def test_prompt_carries_both_photos(checkpoint, batch):
    grid = batch["image_grid_thw"]
    assert grid.shape[0] == hf_parity.PHOTOS
    # one image token per 2x2 merged patch, as the processor's own merge size makes them
    image_tokens = int((batch["input_ids"] == image_token_id(checkpoint)).sum())
    assert image_tokens == int(grid.prod(-1).sum()) // 4 > 0


def image_token_id(hf_dir: Path) -> int:
    import json

    return json.loads((hf_dir / "config.json").read_text())["image_token_id"]


def test_logits_verdict_passes_the_same_model_and_fails_a_wrong_mapping(checkpoint, batch, ref32, tmp_path):
    from safetensors.torch import load_file, save_file

    same = hf_parity.compare(ref32, ref32.clone())
    assert same["passed"] and same["cosine"] > 0.999999 and same["max_abs_diff"] == 0.0
    # BF16 rounding of the same model stays inside the tolerance
    assert hf_parity.compare(ref32, ref32.bfloat16().float())["passed"]
    # a transposed square projection in every decoder layer (a mapping bug) is caught
    wrong = tmp_path / "wrong"
    shutil.copytree(checkpoint, wrong)
    (shard,) = sorted(wrong.glob("*.safetensors"))
    weights = load_file(str(shard))
    hit = [n for n, w in weights.items() if n.startswith("model.language_model.") and w.ndim == 2
           and w.shape[0] == w.shape[1] and "embed" not in n]
    assert hit
    for n in hit:
        weights[n] = weights[n].t().contiguous()
    save_file(weights, str(shard), metadata={"format": "pt"})
    verdict = hf_parity.compare(ref32, cpu_logits(wrong, batch))
    assert not verdict["passed"], verdict


def test_swapped_norms_fail_the_fp32_control(checkpoint, batch, ref32, tmp_path):
    """The first decoder layer's two norms swapped (a mapping mistake that a checkpoint of equal norms would hide)
    miss the FP32 control, where the same model in BF16 passes it."""
    import torch
    from safetensors.torch import load_file, save_file

    ref16 = cpu_logits(checkpoint, batch, torch.bfloat16)
    assert hf_parity.compare(ref16, ref16.clone(), ref32)["passed"]
    swapped = tmp_path / "swapped"
    shutil.copytree(checkpoint, swapped)
    (shard,) = sorted(swapped.glob("*.safetensors"))
    weights = load_file(str(shard))
    pre = "model.language_model.layers.0.input_layernorm.weight"
    post = pre.replace("input_layernorm", "post_attention_layernorm")
    assert not torch.equal(weights[pre], weights[post])  # tiny_hf spreads every 1-D weight
    weights[pre], weights[post] = weights[post], weights[pre]
    save_file(weights, str(shard), metadata={"format": "pt"})
    verdict = hf_parity.compare(ref16, cpu_logits(swapped, batch, torch.bfloat16), ref32)
    assert not verdict["passed"], verdict


def test_frozen_weights_verdict(checkpoint):
    before = verification.tensors(checkpoint)
    assert any(verification.frozen(n) for n in before)
    assert not verification.frozen("model.visual.merger.linear_fc1.weight")  # vision=frozen trains the mergers
    lm = next(n for n in before if n.startswith("model.language_model.") and n.endswith("weight"))
    vit = next(n for n in before if verification.frozen(n) and n.endswith("weight"))

    trained = {**before, lm: before[lm] + 1}
    ok = verification.weight_check(before, trained)
    assert ok["passed"] and ok["frozen_differ"] == [] and ok["language_tensors_changed"] == 1
    assert ok["cosine"] == pytest.approx(1.0) and ok["max_abs_diff"] == 0.0

    leaked = {**trained, vit: before[vit] * 0.5}
    bad = verification.weight_check(before, leaked)
    assert not bad["passed"] and bad["frozen_differ"] == [vit] and bad["max_abs_diff"] > 0

    untrained = verification.weight_check(before, dict(before))  # the control: training must change something
    assert not untrained["passed"] and untrained["language_tensors_changed"] == 0

    dropped = {k: v for k, v in trained.items() if k != vit}
    assert verification.weight_check(before, dropped)["frozen_missing"] == [vit]


def test_resume_verdict():
    ref = {s: 10.0 - s for s in range(8)}
    resumed = {s: ref[s] + 0.001 for s in range(4, 8)}
    ok = verification.loss_check(ref, resumed, checkpoint_step=4)
    assert ok["passed"] and ok["steps_compared"] == 4 and ok["first_step_after_resume"] == 4
    off = {s: ref[s] + 2 * resume.TOLERANCE for s in range(4, 8)}
    assert not verification.loss_check(ref, off, checkpoint_step=4)["passed"]
    assert not verification.loss_check(ref, resumed, checkpoint_step=None)["passed"]  # nothing was checkpointed
    assert not verification.loss_check(ref, {}, checkpoint_step=4)["passed"]


def test_reload_finds_every_weight(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    got = verification.reload(checkpoint)
    assert got["passed"] and got["missing_keys"] == [] and got["unexpected_keys"] == []
    short = tmp_path / "short"
    shutil.copytree(checkpoint, short)
    (shard,) = sorted(short.glob("*.safetensors"))
    weights = load_file(str(shard))
    gone = next(n for n in weights if n.startswith("model.language_model.layers.0."))
    save_file({k: v for k, v in weights.items() if k != gone}, str(shard), metadata={"format": "pt"})
    bad = verification.reload(short)
    assert not bad["passed"] and bad["missing_keys"]


def test_a_subset_of_checks_runs_only_what_it_rests_on():
    everything = verification.needed(verification.CHECKS)
    assert all(everything.values())
    # Qwen3.5's four checks not yet run: run A and its export, run C; no kill-and-resume run B
    assert verification.needed(("parity_trained", "export_fsdp", "reload_fsdp", "frozen_fsdp")) == {
        "a": True, "b": False, "export": True, "c": True}
    assert verification.needed(("resume",)) == {"a": True, "b": True, "export": False, "c": False}
    assert verification.needed(("parity_import",)) == {"a": False, "b": False, "export": False, "c": False}
    assert verification.needed(("frozen_fsdp",)) == {"a": False, "b": False, "export": False, "c": True}


def test_the_training_runs_differ_only_where_they_must(tmp_path: Path) -> None:
    """Run B is run A's training on its own checkpoint dir (kill_and_resume interrupts it after KILL_AFTER); run C
    trains on FSDP; each a one-GPU training case."""
    runs = verification.training(tmp_path, ["model=tiny"])
    a, b, c = runs["a"], runs["b"], runs["c"]
    assert [o.replace("ckpt_a", "ckpt_b") for o in a.overrides] == b.overrides
    assert {(r.gpus, r.dry_run) for r in runs.values()} == {(1, False)} and "wandb.enabled=false" in b.command_line()
    assert b.setting("train.checkpoint_dir") == str(tmp_path / "ckpt_b") and a.setting("parallelism") == "3d"
    assert c.setting("parallelism") == "fsdp" and c.setting("train.iterations") == str(verification.SAVE_INTERVAL)
