"""Small Hugging Face checkpoints of both model families, built locally with transformers' own model classes (random
init, fixed seed, nothing downloaded): the input `model.hf_path` tests and the export round trip read.

    vlmtrain lab tiny-hf qwen3_vl OUT [--num-layers N] [--dtype float32]

The config is the model group's own HF config of conf/model/tiny.yaml (qwen3_vl) or conf/model/tiny_qwen35.yaml
(qwen35_vl), so its keys and nesting are the published checkpoints'; the processor is vlmtrain's offline one, so
the token ids match what the data is processed with.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlmtrain.config.groups.model import Family, ModelConfig, hf_config

OPTIONS = {Family.qwen3_vl: "tiny", Family.qwen35_vl: "tiny_qwen35"}
"""The conf/model option each family's tiny checkpoint takes its shapes from."""
SEED = 0
SPREAD = 0.1
"""Every 1-D weight (norms, biases, the Gated DeltaNet's A_log and dt_bias) gets noise of this std on top of its
init: transformers initializes each kind to one value (every RMSNorm of Qwen3.5 to 0), and a mapping that swapped two
such tensors would pass an import parity check unseen and show only once training moved them apart."""


def model_config(family: str, num_layers: int) -> ModelConfig:
    """The conf/model option of `family` as the model group composes it, with `num_layers` decoder layers."""
    from omegaconf import OmegaConf

    from vlmtrain.lab.kit.runner import ROOT

    option = OPTIONS[Family(family)]
    schema = OmegaConf.structured(ModelConfig)
    yaml = OmegaConf.load(ROOT / "conf" / "model" / f"{option}.yaml")
    merged = OmegaConf.merge(schema, yaml, {"num_layers": num_layers})
    return OmegaConf.to_object(merged)


def build(family: str, out: Path, num_layers: int = 4, dtype: str = "bfloat16") -> Path:
    """Write a random-init checkpoint (1-D weights spread by SPREAD) of `family` (qwen3_vl or qwen35_vl) with
    `num_layers` decoder layers into `out` (config.json, model.safetensors, tokenizer and processor files), its
    weights in `dtype` (the published ones are bfloat16; float32 is what a checkpoint saved from an FP32 model holds);
    returns `out`."""
    import torch
    from transformers import AutoModelForImageTextToText

    from vlmtrain.data.processor import build_processor, vision_token_ids

    out = Path(out)
    build_processor(out)  # first: it moves a finished folder into place
    cfg = hf_config(model_config(family, num_layers), vision_token_ids(out))
    cfg.dtype = getattr(torch, dtype)
    torch.manual_seed(SEED)
    model = AutoModelForImageTextToText.from_config(cfg, dtype=cfg.dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p, dtype=torch.float32).mul_(SPREAD).to(p.dtype))
    model.save_pretrained(str(out))
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("family", choices=[f.value for f in Family])
    ap.add_argument("out", type=Path)
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")


def run(a: argparse.Namespace) -> int:
    print(build(a.family, a.out, a.num_layers, a.dtype))
    return 0
