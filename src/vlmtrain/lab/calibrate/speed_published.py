"""Megatron Bridge's published H100 figures, each as the vlmtrain run that has its layout, against check.speed.

Each figure is a step time and a model TFLOP/s/GPU over Bridge's own FLOP count (padded slots counted), so the
prediction is compared on the step: the predicted TFLOP/s/GPU is the published one times published / predicted
step time (the same FLOPs over the predicted time). The workload is the published run's: its GBS x sequence length
of decoder tokens, its images (text recipes: none, `Workload.text_only`). What vlmtrain cannot express of a recipe
(an overlap it does not run, a precision detail) is listed with the figure; `vlmtrain lab calibrate-speed
--published` prints the table docs/performance.md holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmtrain.check import speed
from vlmtrain.check.speed.calibration import Calibration
from vlmtrain.check.speed.workload import from_samples
from vlmtrain.config.compose import compose
from vlmtrain.config.resolve import resolve
from vlmtrain.lab.kit.case import Case

BRIDGE = "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/"


@dataclass(frozen=True)
class Figure:
    case: Case
    """The vlmtrain run with the recipe's layout, batch, dispatcher, recompute and graphs (named for the figure)."""
    source: str
    step_s: float
    tflops_per_gpu: float
    tokens: float
    """Real tokens per sample."""
    images: float
    """Images per sample (0: a text recipe, no ViT)."""
    image_tokens: float
    differs: str
    """What of the recipe the vlmtrain run does not reproduce."""


QWEN36_H100 = Case("Qwen3.6-35B-A3B VLM pretrain, 16 H100 BF16, DataComp (real data, padded to 4096)", 16, [
    "model=qwen35_vl_35b_a3b", "hardware=h100", "nodes=2", "gpus_per_node=8", "parallelism=3d", "parallelism.tp=1",
    "parallelism.pp=2", "parallelism.ep=8", "parallelism.first_stage_layers=16", "parallelism.last_stage_layers=24",
    "dispatcher=hybridep", "recompute=selective", "recompute.modules=[core_attn,gdn_norm_out,moe_act]",
    "cuda_graph=attn_moe_router_preprocess", "kernels=default", "kernels.cross_entropy=te",
    "train.micro_batch_size=1", "train.global_batch_size=512", "train.seq_length=4096", "data=mock",
    "data.pad_to_max_length=true", "precision.precision_aware_optimizer=true",
    "+bridge.ddp.overlap_grad_reduce=false", "+bridge.ddp.overlap_param_gather=false"])
QWEN3_30B_H100 = Case("Qwen3-30B-A3B pretrain, 16 H100 BF16, mock text (text-only decoder)", 16, [
    "model=qwen3_vl_30b_a3b", "hardware=h100", "nodes=2", "gpus_per_node=8", "parallelism=3d", "parallelism.ep=16",
    "dispatcher=hybridep", "cuda_graph=moe_router_preprocess", "kernels=default", "train.micro_batch_size=1",
    "train.global_batch_size=1024", "train.seq_length=4096", "data=mock", "data.pad_to_max_length=true",
    "precision.precision_aware_optimizer=true"])
FIGURES = (
    Figure(QWEN36_H100,
           BRIDGE + "docs/model-verification/models/qwen3.6-35b-a3b.md (pretrain_performance, H100; recipe "
           "qwen35_vl_35b_a3b_pretrain_16gpu_h100_bf16_functional_config in "
           "src/megatron/bridge/recipes/qwen_vl/h100/qwen35_vl.py)",
           22.27122, 135.61, tokens=196 + 34, images=1.0, image_tokens=196.0,
           differs="BF16 gradient reduce (vlmtrain reduces in FP32); an MTP layer if the provider keeps one; the "
                   "caption's 34 text tokens are assumed"),
    Figure(QWEN3_30B_H100,
           BRIDGE + "docs/model-verification/models/qwen3-30b-a3b.md (pretrain_performance, H100; recipe "
           "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config in src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py)",
           20.14729, 299.352, tokens=4096, images=0.0, image_tokens=0.0,
           differs="the recipe overlaps the MoE all-to-all with compute (overlap_moe_expert_parallel_comm), which "
                   "the Qwen-VL step cannot; forced expert balance; BF16 gradient reduce"),
)
NOT_FOUND = ("Qwen3-235B-A22B pretrain, H100 BF16: Megatron Bridge has the recipe "
             "(qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config: 256 GPUs, TP2 PP8 VPP4 EP32, GBS 8192) but publishes "
             "no BF16 H100 figure for it: its model-verification card lists pretrain and pretrain_performance on "
             "H100 as unverified, and the performance summary's H100 rows are FP8 (docs/performance-summary.md, "
             "docs/performance-summary-archive.md). Not compared.")


@dataclass(frozen=True)
class Compared:
    figure: Figure
    predicted: speed.StepTime

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted.step_s - self.figure.step_s) / self.figure.step_s

    @property
    def tflops_per_gpu(self) -> float:
        return self.figure.tflops_per_gpu * self.figure.step_s / self.predicted.step_s


def compare(f: Figure, cal: Calibration) -> Compared:
    run = compose(list(f.case.overrides), output_dir="outputs/compose")
    res = resolve(run)
    samples = float(run.train.global_batch_size)
    w = from_samples(run, res, samples, f.tokens, f.images, f.image_tokens, 1.0,
                     f"the published run's {int(samples)} samples of {f.tokens:.0f} real tokens"
                     + (f", {f.images:.0f} image of {f.image_tokens:.0f} tokens each" if f.images else ", text only"))
    return Compared(f, speed.predict(run, res, w.text_only() if not f.images else w, cal))


def markdown_table(cal: Calibration) -> str:
    out = ["| published run | GPUs | published s/step (TFLOP/s/GPU) | predicted s/step (TFLOP/s/GPU) | error % | "
           "largest predicted terms | not reproduced |", "|---|---:|---:|---:|---:|---|---|"]
    for c in (compare(f, cal) for f in FIGURES):
        t = c.predicted
        top = sorted(speed.TERMS, key=lambda n: -getattr(t, n))[:3]
        terms = ", ".join(f"{n} {getattr(t, n):.1f} s" for n in top)
        f = c.figure
        out.append(f"| {f.case.name} | {f.case.gpus} | {f.step_s:.2f} ({f.tflops_per_gpu:.1f}) | "
                   f"{t.step_s:.2f} ({c.tflops_per_gpu:.1f}) | {c.error_pct:+.1f} | {terms} | {c.figure.differs} |")
    out += ["", NOT_FOUND, "", "Sources:"] + [f"- {f.case.name}: {f.source}" for f in FIGURES]
    return "\n".join(out) + "\n"
