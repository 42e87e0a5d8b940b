"""model.hf_path: a tiny checkpoint of each family built with transformers' own classes (lab.checks.tiny_hf) is
read by the real dry run (the provider's shapes, the processor, Bridge's pretrained_checkpoint, HF_HUB_OFFLINE; the
plan train.py prints, made in this process), and preflight refuses a mismatch, a dir without config.json and an
unsupported architecture."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmtrain.build import container, target
from vlmtrain.check import preflight
from vlmtrain.config.resolve import resolve
from vlmtrain.lab.checks import tiny_hf

OPTION = {"qwen3_vl": "tiny", "qwen35_vl": "tiny_qwen35"}


@pytest.fixture(scope="module", params=["qwen3_vl", "qwen35_vl"])
def checkpoint(request, tiny_checkpoint) -> tuple[str, Path]:
    return request.param, tiny_checkpoint(request.param)


def messages(run) -> list[str]:
    return [f.message for f in preflight.errors(preflight.check(run, resolve(run)))]


def test_dry_run_builds_the_provider_from_the_dir(compose, bridge, checkpoint):
    family, path = checkpoint
    run = compose(f"model={OPTION[family]}", f"model.hf_path={path}")
    res = resolve(run)
    assert messages(run) == []
    assert res.env_vars["HF_HUB_OFFLINE"] == "1"
    cfg = container.build(run, res)
    target.finalize(run, res, cfg)
    assert cfg.checkpoint.pretrained_checkpoint == str(path)  # Bridge loads the weights after the DDP/FSDP wrap
    assert cfg.dataset.hf_processor_path == str(path)  # tokenizer and processor from the dir
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_moe_experts) == (4, 256, 8)


def test_shapes_come_from_the_dir(compose, bridge, checkpoint, tmp_path):
    family, _ = checkpoint
    path = tiny_hf.build(family, tmp_path / "ckpt", num_layers=8)
    run = compose(f"model={OPTION[family]}", f"model.hf_path={path}", "model.num_layers=8")
    assert messages(run) == []
    cfg = container.build(run, resolve(run))
    assert cfg.model.num_layers == 8


def test_a_mismatch_names_both_values(compose, checkpoint):
    family, path = checkpoint
    (msg,) = messages(compose(f"model={OPTION[family]}", f"model.hf_path={path}", "model.num_layers=2"))
    assert "model.num_layers=2 but config.json text_config.num_hidden_layers=4" in msg
    other = "tiny_qwen35" if family == "qwen3_vl" else "tiny"
    (msg,) = messages(compose(f"model={other}", f"model.hf_path={path}"))
    assert "model.family=" in msg and family in msg


def test_not_a_checkpoint_is_refused(compose, tmp_path):
    (msg,) = messages(compose(f"model.hf_path={tmp_path}"))
    assert f"model.hf_path={tmp_path} has no config.json" in msg
    assert "Qwen3VLMoeForConditionalGeneration, Qwen3_5MoeForConditionalGeneration" in msg


def test_an_unsupported_architecture_is_refused(compose, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=128)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    (msg,) = messages(compose(f"model.hf_path={tmp_path}"))
    assert "architectures=['LlamaForCausalLM']" in msg and "model_type='llama'" in msg
    assert "Qwen3_5MoeForConditionalGeneration" in msg


def test_dry_run_with_hf_path(dry_run, checkpoint, tmp_path):
    family, path = checkpoint
    status, printed = dry_run(f"model={OPTION[family]}", f"model.hf_path={path}", run_dir=tmp_path)
    assert status == 0, printed[-3000:]
    assert "'HF_HUB_OFFLINE': '1'" in printed and "preflight:" in printed
    assert "[error]" not in printed and "[warning]" not in printed  # info lines: what the auto defaults left off
    assert f"pretrained_checkpoint: {path}" in (tmp_path / "bridge_config.yaml").read_text()
