"""Logits of one real-image prompt through transformers and through vlmtrain's Megatron model, compared: the parity
checks of vlmtrain.lab.checks.verification, each in a process of its own (one GPU, a single-rank NCCL group).

    python -m vlmtrain.lab.checks.hf_parity --reference HF_DIR --model-option tiny --out parity.json
        [--megatron ITER_DIR]

The transformers side is `--reference` loaded with `from_pretrained`. The Megatron side is built by the model
group's own `build_provider` (`model.hf_path=HF_DIR`, so the same provider a run with that override trains) with the
HF weights loaded through Bridge's mapping, or, with `--megatron`, loaded from a run's checkpoint iteration by
Bridge's `load_megatron_model` (the model the run trained). The prompt: two of vlmtrain's shipped photos and a
question, through the checkpoint's own processor and chat template.

Tolerance. Both sides run in BF16, the dtype of the checkpoints and of training, so the comparison is of the model
a user runs and not of an fp32 variant neither side trains in. The two implementations differ in kernels (TE fused
attention and grouped expert GEMMs vs transformers' SDPA and per-expert loops) and in reduction order, so each op
carries its own BF16 rounding (unit roundoff 2^-8) through 4 decoder and 2 ViT layers, and a token whose router
scores are near a tie may take another expert on one side; both move single logits by a few percent of the logit
range while the whole-sequence cosine stays above 0.99. A wrong weight mapping (a transposed or swapped projection,
a misplaced expert, a missing deepstack merger) decorrelates the logits: cosine near 0. Passing therefore needs
cosine >= COSINE_MIN and max |difference| <= MAX_ABS_REL x max |reference logit|.

With the control, the verdict is the control's instead. The same reference in FP32 is the function of these
weights without BF16 rounding; the transformers model's own BF16 error against it (`ref_bf16_rel_l2`, relative L2
over all logits) is the noise floor of a correct BF16 implementation, and the Megatron model passes when it sits at
most NOISE_X times that far from it (`rel_l2_vs_fp32`) with cosine >= COSINE_MIN: a bound from a measurement on the
same machine and inputs, where the max-|difference| rule above is a guess that one logit can break either way
(`passed_max_abs_rule` keeps its verdict). Per decoder layer, the relative L2 of each side's output against the FP32
reference (`layers`) says where a difference enters. `control_norm_swap_rel_l2` is how far one mapping mistake
lands (the first decoder layer's two norms swapped in the FP32 reference): on a checkpoint whose norms all hold one
value it is invisible, which is why vlmtrain.lab.checks.tiny_hf spreads them. A random-init model is insensitive to
small mistakes (near-uniform attention): on CPU, swapping one layer's query and key norms moved the logits by 1.4x
the BF16 floor and two Gated DeltaNet layers' dt_bias by 1.15x, under the bound; a layer's two norms by 5-6x.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

COSINE_MIN = 0.99
MAX_ABS_REL = 0.1
NOISE_X = 2.0
"""Two independent BF16 implementations each carry the reference's own rounding; twice its size is their bound."""
PHOTOS = 2
PROMPT = "Describe both pictures in one sentence each."


def inputs(hf_dir: Path) -> dict[str, Any]:
    """Token ids, pixel values and image grids of the prompt, as the checkpoint's processor makes them."""
    from transformers import AutoProcessor

    from vlmtrain.data.photos import PHOTOS as SHIPPED
    from vlmtrain.data.photos import load_photo

    processor = AutoProcessor.from_pretrained(str(hf_dir), local_files_only=True)
    images = [load_photo(p) for p in SHIPPED[:PHOTOS]]
    content = [{"type": "image", "image": im} for im in images] + [{"type": "text", "text": PROMPT}]
    return dict(processor.apply_chat_template([{"role": "user", "content": content}], tokenize=True,
                                              add_generation_prompt=True, return_dict=True, return_tensors="pt"))


def layer_outputs(layers: Any) -> tuple[list[Any], list[Any]]:
    """Forward hooks that keep each decoder layer's output hidden states as [tokens, hidden] fp32 on CPU (Megatron's
    layers give ([s, b, h], context), transformers' [b, s, h]); returns (outputs, handles)."""
    kept: list[Any] = []

    def keep(_module: Any, _args: Any, out: Any) -> None:
        h = out[0] if isinstance(out, tuple) else out
        kept.append(h.detach().float().reshape(-1, h.shape[-1]).cpu())

    return kept, [layer.register_forward_hook(keep) for layer in layers]


def transformers_logits(hf_dir: Path, batch: dict[str, Any], dtype: str = "bfloat16",
                        swap_norms: bool = False) -> tuple[Any, list[Any]]:
    """The reference's logits and decoder-layer outputs in `dtype`; `swap_norms`: the control's mapping mistake."""
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(hf_dir), dtype=getattr(torch, dtype),
                                                        local_files_only=True)
    model = model.cuda().eval()
    layers = model.model.language_model.layers
    if swap_norms:
        first = layers[0]
        with torch.no_grad():
            pre = first.input_layernorm.weight.clone()
            first.input_layernorm.weight.copy_(first.post_attention_layernorm.weight)
            first.post_attention_layernorm.weight.copy_(pre)
    kept, handles = layer_outputs(layers)
    with torch.no_grad():
        out = model(**{k: v.cuda() for k, v in batch.items()})
    for h in handles:
        h.remove()
    del model
    return out.logits[0].float().cpu(), kept


def megatron_model(hf_dir: Path, model_option: str, megatron: Path | None) -> Any:
    """vlmtrain's model: from the HF dir through the model group's provider, or from a run's checkpoint."""
    import torch
    from megatron.bridge import AutoBridge

    from vlmtrain.train.bridge_patches import install_wgrad_fusion

    install_wgrad_fusion()  # kernels' default gradient_accumulation_fusion builds without APEX only with it
    bridge = AutoBridge.from_hf_pretrained(str(hf_dir), dtype=torch.bfloat16)
    if megatron is not None:
        return bridge.load_megatron_model(str(megatron), wrap_with_ddp=False)[0]
    from vlmtrain.config.compose import compose
    from vlmtrain.config.groups.model import build_provider
    from vlmtrain.data.processor import vision_token_ids

    layers = json.loads((hf_dir / "config.json").read_text())["text_config"]["num_hidden_layers"]
    run = compose([f"model={model_option}", f"model.num_layers={layers}", f"model.hf_path={hf_dir}"])
    provider = build_provider(run, vision_token_ids(hf_dir))
    provider.params_dtype, provider.bf16 = torch.bfloat16, True
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False)
    bridge.load_hf_weights(model)
    return model[0]


def vlmtrain_logits(hf_dir: Path, model_option: str, megatron: Path | None,
                    batch: dict[str, Any]) -> tuple[Any, list[Any]]:
    import torch
    from megatron.bridge.training.model_load_save import temporary_distributed_context

    from vlmtrain.train.unwrap import unwrap

    with temporary_distributed_context(backend="nccl"):
        model = megatron_model(hf_dir, model_option, megatron).cuda().eval()
        kept, handles = layer_outputs(unwrap(model).language_model.decoder.layers)  # inside Float16Module
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"].cuda(), position_ids=None, attention_mask=None,
                           pixel_values=batch["pixel_values"].cuda().bfloat16(),
                           image_grid_thw=batch["image_grid_thw"].cuda())
        for h in handles:
            h.remove()
        out = logits[0].float().cpu()
        del model
    return out, kept


BLOCK = 1 << 18
"""Values compared at a time: 2 MB in float64, which malloc reuses; blocks of 32 MB each took fresh pages from the
kernel, and the page faults cost 4x the arithmetic."""


def sums(x: Any, y: Any) -> dict[str, float]:
    """x.y, x.x, y.y, |x - y|^2, max |x - y| and max |x| of the two flattened tensors, in float64 a block at a time:
    whole [tokens x vocab] logits in float64 are a GB each, and allocating them cost more than the forward passes."""
    x, y = x.flatten(), y.flatten()
    out = dict.fromkeys(("xy", "xx", "yy", "dd", "max_diff", "max_x"), 0.0)
    for i in range(0, x.numel(), BLOCK):
        a, b = x[i:i + BLOCK].double(), y[i:i + BLOCK].double()
        d = a - b
        out["xy"] += float(a.dot(b))
        out["xx"] += float(a.dot(a))
        out["yy"] += float(b.dot(b))
        out["dd"] += float(d.dot(d))
        out["max_diff"] = max(out["max_diff"], float(d.abs().max()))
        out["max_x"] = max(out["max_x"], float(a.abs().max()))
    return out


def rel_l2(ref: Any, got: Any) -> float:
    """||got - ref|| / ||ref||, in float64."""
    return rel_l2_of(sums(ref, got))


def rel_l2_of(s: dict[str, float]) -> float:
    """||y - x|| / ||x|| of sums()' two sides."""
    return (s["dd"] / s["xx"]) ** 0.5


def cosine_of(s: dict[str, float]) -> float:
    """The cosine of sums()' two sides."""
    return s["xy"] / (s["xx"] * s["yy"]) ** 0.5


def compare(ref: Any, got: Any, ref32: Any | None = None, control: Any | None = None) -> dict[str, Any]:
    """cosine and max |difference| of two [tokens, vocab] logit tensors, the top-1 agreement, and the verdict; with
    `ref32` (the reference in FP32) the noise-floor control of the module docstring, with `control` (the FP32
    reference with a mapping mistake) how far such a mistake lands."""
    s = sums(ref, got)
    cosine, max_abs, ref_max = cosine_of(s), s["max_diff"], s["max_x"]
    top1 = float((ref.argmax(-1) == got.argmax(-1)).double().mean())
    passed = cosine >= COSINE_MIN and max_abs <= MAX_ABS_REL * ref_max
    out = {"cosine": cosine, "max_abs_diff": max_abs, "reference_max_abs": ref_max, "top1_agreement": top1,
           "tokens": int(ref.shape[0]), "cosine_min": COSINE_MIN, "max_abs_rel": MAX_ABS_REL}
    if ref32 is not None:
        s32 = sums(ref32, got)
        floor, dist, c32 = rel_l2(ref32, ref), rel_l2_of(s32), cosine_of(s32)
        within = dist <= NOISE_X * floor
        out |= {"ref_bf16_rel_l2": floor, "rel_l2_vs_fp32": dist, "cosine_vs_fp32": c32, "noise_x": NOISE_X,
                "within_noise": within, "passed_max_abs_rule": passed}
        passed = c32 >= COSINE_MIN and within
    if control is not None and ref32 is not None:
        out["control_norm_swap_rel_l2"] = rel_l2(ref32, control)
    return {**out, "passed": passed}


def layer_table(ref32: list[Any], ref: list[Any], got: list[Any]) -> list[dict[str, float]]:
    """Per decoder layer: each side's output against the FP32 reference's (relative L2)."""
    return [{"layer": i, "ref_bf16_rel_l2": rel_l2(r32, r), "vlmtrain_rel_l2": rel_l2(r32, g)}
            for i, (r32, r, g) in enumerate(zip(ref32, ref, got, strict=False))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", type=Path, required=True, help="the HF dir transformers loads")
    ap.add_argument("--hf", type=Path, help="the HF dir the Megatron side is built from (default: --reference)")
    ap.add_argument("--model-option", required=True, help="the conf/model option of the checkpoint (tiny, ...)")
    ap.add_argument("--megatron", type=Path, help="a run's iter_XXXXXXX dir: the trained model instead")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    hf = a.hf or a.reference
    import torch  # noqa: F401  (before transformer_engine)
    import transformer_engine.pytorch  # noqa: F401  (its cuDNN before transformers' ViT loads torch's: they clash)

    batch = inputs(a.reference)
    ref, ref_layers = transformers_logits(a.reference, batch)
    got, got_layers = vlmtrain_logits(hf, a.model_option, a.megatron, batch)
    try:  # the control; without it (a kernel that refuses FP32, say) the verdict is the max-|difference| rule's
        ref32, ref32_layers = transformers_logits(a.reference, batch, "float32")
        control = transformers_logits(a.reference, batch, "float32", swap_norms=True)[0]
    except Exception as e:  # noqa: BLE001  (recorded in the row, never hidden)
        metrics = {**compare(ref, got), "control_error": f"{type(e).__name__}: {e}"[:500]}
    else:
        metrics = {**compare(ref, got, ref32, control), "layers": layer_table(ref32_layers, ref_layers, got_layers)}
    a.out.write_text(json.dumps(metrics))
    print(json.dumps(metrics), flush=True)
    return 0 if metrics["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
