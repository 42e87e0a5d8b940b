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


def test_an_expert_count_mismatch_is_refused(compose, checkpoint):
    """transformers 5 saves Qwen3-VL-MoE's expert count as text_config.num_local_experts, Qwen3.5's as
    num_experts: either spelling is compared (Bridge would build the checkpoint's 8 experts, not the group's 16)."""
    import json

    family, path = checkpoint
    key = {"qwen3_vl": "num_local_experts", "qwen35_vl": "num_experts"}[family]
    assert json.loads((path / "config.json").read_text())["text_config"][key] == 8
    (msg,) = messages(compose(f"model={OPTION[family]}", f"model.hf_path={path}", "model.num_experts=16"))
    assert f"model.num_experts=16 but config.json text_config.{key}=8" in msg


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


def test_the_step0_embedding_check_compares_at_the_models_dtype(tmp_path):
    """A float32 checkpoint loads into a bf16 model rounded: the check (train.after_build, before step 1) compares
    against the checkpoint's value cast to the model's dtype, so that load passes and a weight that did not load
    still fails it."""
    import torch
    from megatron.core import parallel_state

    from vlmtrain.train import hf_loaded

    path = tiny_hf.build("qwen3_vl", tmp_path / "fp32", num_layers=1, dtype="float32")
    theirs = hf_loaded.hf_tensor(str(path), hf_loaded.HF_EMBEDDING)
    assert theirs.dtype == torch.float32
    padded = torch.cat([theirs, torch.zeros(2, theirs.shape[1])]).to(torch.bfloat16)  # + Megatron's vocab padding

    def built(weight: torch.Tensor) -> list[torch.nn.Module]:
        model = torch.nn.Module()
        model.language_model = torch.nn.Module()
        model.language_model.embedding = torch.nn.Module()
        model.language_model.embedding.word_embeddings = torch.nn.Embedding(*weight.shape, dtype=weight.dtype)
        model.language_model.embedding.word_embeddings.weight = torch.nn.Parameter(weight)
        return [model]

    not_loaded = padded.clone()
    not_loaded[3, 5] += 0.5
    parallel_state.set_tensor_model_parallel_rank(0)  # one TP rank: the whole vocab
    try:
        assert hf_loaded.embedding_max_diff(str(path), built(padded)) == 0.0
        assert hf_loaded.embedding_max_diff(str(path), built(not_loaded)) > 0.4  # 0.5 at bf16
    finally:
        parallel_state.set_tensor_model_parallel_rank(None)
