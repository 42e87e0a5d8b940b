"""Check vlmtrain's MFU and useful throughput of a real GPU run against independently computed values.

    vlmtrain lab metrics-check <run dir of a 1-GPU train.py run>
        [--results results/metrics_check.jsonl]

Independent of vlmtrain.config.flops (per-layer shape formulas) and of the training-time token counters:
- FLOPs from the parameter counts of the instantiated model (checks.json, per tower): 2 FLOPs per active
  parameter per token (MoE experts weighted top-k / E, embedding lookups excluded) + causal attention
  2*nq*d*s^2 per layer and sequence, and the ViT's bidirectional 4*P^2*h per layer and image; x3 for a trained
  part, as in vlmtrain.config.flops' docstring.
- Non-pad tokens by re-tokenizing the very samples each step consumed (Bridge's dataset and cyclic sampler
  order) with the processor directly (chat template + processor call per sample, no collate, no Megatron step).
- Component times: time_* columns must add up to step_s within TOLERANCE_COMPONENTS.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from vlmtrain.config import architecture as arch
from vlmtrain.config.resolve import Resolved
from vlmtrain.config.schema import RunConfig
from vlmtrain.lab.kit import experiments, store
from vlmtrain.launch import local
from vlmtrain.observe import run_summary

TOLERANCE_MFU = 0.05  # relative: parameter-count vs shape-formula FLOPs (norms, router, biases differ)
TOLERANCE_TOKENS = 0.0  # exact: the same samples tokenized another way
TOLERANCE_COMPONENTS = 0.10  # named components cover >= 90 % of the step


def samples_per_step(run: RunConfig, res: Resolved, steps: int) -> list[list[dict]]:
    """The samples each global step consumed, tokenized independently of the collate and the Megatron step.

    The order is Bridge's own: its dataset and the same `cyclic` sampler (MegatronPretrainingRandomSampler)
    for every data-parallel rank; each sample is then rendered with the chat template and the processor alone.
    """
    from megatron.bridge.data.samplers import MegatronPretrainingRandomSampler
    from megatron.bridge.data.utils import get_dataset_provider
    from qwen_vl_utils import process_vision_info
    from transformers import AutoProcessor

    from vlmtrain.build import container
    from vlmtrain.data import prepare

    cfg = container.build(run, res)
    gbs, mbs, dp = run.train.global_batch_size, run.train.micro_batch_size, res.layout.dp
    ds = get_dataset_provider(cfg.dataset)([run.train.iterations * gbs, 0, 0], cfg.dataset)[0]
    ranks = [
        iter(
            MegatronPretrainingRandomSampler(
                ds,
                total_samples=len(ds),
                consumed_samples=0,
                micro_batch_size=mbs,
                data_parallel_rank=r,
                data_parallel_size=dp,
                data_sharding=True,
            )
        )
        for r in range(dp)
    ]
    proc = AutoProcessor.from_pretrained(str(prepare.processor_dir(run)))
    out = []
    for _ in range(steps):
        idx = [i for it in ranks for _ in range(res.grad_accum) for i in next(it)]
        batch = []
        for i in idx:
            conv = ds[i]["conversation"]
            images, _ = process_vision_info(conv)
            enc = proc(
                text=[proc.apply_chat_template(conv, tokenize=False)],
                images=images,
                min_pixels=200704,
                max_pixels=1003520,
                return_tensors="pt",
            )
            grid = enc["image_grid_thw"].prod(-1).tolist() if "image_grid_thw" in enc else []
            batch.append({"len": int(enc["input_ids"].shape[1]), "patches": [int(p) for p in grid]})
        out.append(batch)
    return out


def flops_from_params(run: RunConfig, params: dict, batch: list[dict]) -> float:
    m, v = run.model, run.model.vit
    dec_total = sum(params["decoder"].values())
    experts = m.num_layers * m.num_experts * 3 * m.hidden_size * m.moe_ffn_hidden_size
    active_dec = dec_total - m.vocab_size * m.hidden_size - experts * (1 - m.moe_topk / m.num_experts)
    vit_total = sum(params["vision"].values()) - arch.VIT_POSITION_EMBEDDINGS * v.hidden_size  # a lookup table
    proj_total = sum(params["projector"].values())
    n_attn = arch.layer_types(m).count("full_attention")
    dec = sum(
        2 * active_dec * s["len"] + n_attn * 2 * m.num_attention_heads * m.head_dim * s["len"] ** 2 for s in batch
    )
    patches = [p for s in batch for p in s["patches"]]
    vit = sum(2 * vit_total * p + v.depth * 4 * p * p * v.hidden_size for p in patches)
    proj = sum(2 * proj_total * p / arch.PATCHES_PER_TOKEN for p in patches)
    vis = run.vision
    bwd = lambda trained, upstream: 2 if trained else (1 if upstream else 0)  # noqa: E731
    return (
        vit * (1 + bwd(not vis.freeze_vision_model, False))
        + proj * (1 + bwd(not vis.freeze_vision_projection, not vis.freeze_vision_model))
        + dec * (1 + bwd(not vis.freeze_language_model, True))
    )


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("run_dir", type=Path)
    experiments.add_results(ap, "metrics_check.jsonl")
    ap.add_argument("--name", default=None)
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps left out")


def run(a: argparse.Namespace) -> int:
    cfg, res = local.loaded(a.run_dir / local.RUN_CONFIG)  # the run's saved config and what it resolved
    rows = run_summary.read_jsonl(a.run_dir / "metrics.jsonl")
    checks = json.loads((a.run_dir / "checks.json").read_text())
    per_step = samples_per_step(cfg, res, len(rows))
    gpus, peak = res.layout.world_size, cfg.hardware.peak_bf16_tflops * 1e12
    cmp = []
    for r, batch in zip(rows[a.skip :], per_step[a.skip :], strict=True):
        f = flops_from_params(cfg, checks["params"], batch)
        tokens = sum(s["len"] for s in batch)
        named = sum(
            r.get(k, 0.0)
            for k in ("time_vision_s", "time_projector_s", "time_decoder_s", "time_optimizer_s", "time_data_s")
        )
        cmp.append(
            {
                "mfu": r["mfu"],
                "mfu_independent": f / (r["step_s"] * gpus * peak),
                "useful_tokens_per_s_per_gpu": r["useful_tokens_per_s_per_gpu"],
                "useful_tokens_per_s_per_gpu_independent": tokens / r["step_s"] / gpus,
                "nonpad_tokens": r["nonpad_tokens"],
                "nonpad_tokens_independent": tokens,
                "component_coverage": named / r["step_s"] if named else None,
            }
        )
    med = {
        k: statistics.median(c[k] for c in cmp if c[k] is not None) if any(c[k] is not None for c in cmp) else None
        for k in cmp[0]
    }
    mfu_err = abs(med["mfu"] / med["mfu_independent"] - 1)
    tok_err = max(
        abs(c["nonpad_tokens"] - c["nonpad_tokens_independent"]) / c["nonpad_tokens_independent"] for c in cmp
    )
    ok = (
        mfu_err <= TOLERANCE_MFU
        and tok_err <= TOLERANCE_TOKENS
        and (med["component_coverage"] is None or abs(1 - med["component_coverage"]) <= TOLERANCE_COMPONENTS)
    )
    metrics = {
        **med,
        "mfu_rel_error": mfu_err,
        "nonpad_tokens_max_rel_error": tok_err,
        "tolerance_mfu": TOLERANCE_MFU,
        "tolerance_components": TOLERANCE_COMPONENTS,
        "passed": bool(ok),
    }
    store.append(
        a.results,
        a.name or a.run_dir.name,
        f"{experiments.command(__name__)} {a.run_dir}",
        metrics,
        measured_on="2x NVIDIA H200 (the run dir's GPU run); checked on CPU",
        steps_compared=len(cmp),
    )
    print(json.dumps(metrics, indent=1))
    return 0 if ok else 1
