"""A local Hugging Face checkpoint as `model.hf_path`: its config.json, the family it is, and the model group
fields it must agree with (preflight names each mismatch). Nothing here reaches the hub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vlmtrain.config.groups.model import ModelConfig

ARCHITECTURES = {
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl",
    "Qwen3_5MoeForConditionalGeneration": "qwen35_vl",
}
"""Supported `architectures` entries of config.json -> model.family."""
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
"""One of these marks a full-model checkpoint (Bridge's is_hf_checkpoint_dir looks for the same files)."""
PROCESSOR_FILES = ("tokenizer_config.json",)
"""A dir with these and a processor/preprocessor config supplies the tokenizer and processor itself."""
FIELDS = {
    "num_layers": ("text_config.num_hidden_layers",),
    "hidden_size": ("text_config.hidden_size",),
    "num_attention_heads": ("text_config.num_attention_heads",),
    "num_query_groups": ("text_config.num_key_value_heads",),
    "head_dim": ("text_config.head_dim",),
    "num_experts": ("text_config.num_experts", "text_config.num_local_experts"),
    "moe_topk": ("text_config.num_experts_per_tok",),
    "moe_ffn_hidden_size": ("text_config.moe_intermediate_size",),
    "vocab_size": ("text_config.vocab_size",),
    "vit.depth": ("vision_config.depth",),
    "vit.hidden_size": ("vision_config.hidden_size",),
    "vit.num_heads": ("vision_config.num_heads",),
    "vit.intermediate_size": ("vision_config.intermediate_size",),
}
"""model group field -> the config.json keys (dotted) that may hold it; the first present must equal it.
transformers 5 writes Qwen3-VL-MoE's expert count as num_local_experts (its text config's attribute_map), earlier
versions and Qwen3.5 as num_experts."""


class CheckpointError(ValueError):
    """The dir is not a checkpoint of a supported family."""


def read(hf_path: str, setting: str = "model.hf_path") -> dict[str, Any]:
    """config.json of `hf_path`, checked to be a supported architecture with weights beside it; `setting`: what the
    messages call it (`vlmtrain export --hf-path`)."""
    path = Path(hf_path)
    supported = ", ".join(ARCHITECTURES)
    if not (path / "config.json").is_file():
        found = sorted(p.name for p in path.iterdir())[:12] if path.is_dir() else "no such directory"
        raise CheckpointError(f"{setting}={hf_path} has no config.json (found: {found}); it must be a Hugging "
                              f"Face checkpoint dir (save_pretrained) of one of {supported}.")
    cfg = json.loads((path / "config.json").read_text())
    archs = cfg.get("architectures") or []
    if not any(a in ARCHITECTURES for a in archs):
        raise CheckpointError(f"{setting}={hf_path}: config.json has architectures={archs} (model_type="
                              f"{cfg.get('model_type')!r}); vlmtrain trains {supported}.")
    if not any((path / w).is_file() for w in WEIGHTS):
        raise CheckpointError(f"{setting}={hf_path}: config.json but no weights (none of {', '.join(WEIGHTS)}).")
    return cfg


def family(cfg: dict[str, Any]) -> str:
    return next(ARCHITECTURES[a] for a in cfg["architectures"] if a in ARCHITECTURES)


def value(cfg: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        cfg = cfg.get(part, {}) if isinstance(cfg, dict) else {}
    return None if cfg == {} else cfg


def mismatches(m: ModelConfig, cfg: dict[str, Any]) -> list[str]:
    """`model.X=<group value> but config.json KEY=<dir value>` for every field that differs."""
    out = [f"model.family={m.family} but config.json architectures={cfg['architectures']} is {family(cfg)}"
           ] if str(m.family) != family(cfg) else []
    for field, keys in FIELDS.items():
        mine = m
        for part in field.split("."):
            mine = getattr(mine, part)
        key = next((k for k in keys if value(cfg, k) is not None), None)
        if key is not None and mine != (theirs := value(cfg, key)):
            out.append(f"model.{field}={mine} but config.json {key}={theirs}")
    return out


def has_processor(hf_path: str) -> bool:
    """True when the dir holds a tokenizer and an image processor config (AutoProcessor.from_pretrained reads it)."""
    path = Path(hf_path)
    return all((path / f).is_file() for f in PROCESSOR_FILES) and any(
        (path / f).is_file() for f in ("processor_config.json", "preprocessor_config.json"))


def hf_config(hf_path: str) -> Any:
    """The transformers config of the dir (local files only)."""
    from transformers import AutoConfig

    read(hf_path)
    return AutoConfig.from_pretrained(hf_path, local_files_only=True)
