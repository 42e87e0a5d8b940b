"""The predicted step: every term on the slowest pipeline stage, overlapped as Megatron overlaps it under the run's
flags, then the plan's lines and the `speed.json` a run saves.

Overlaps (read in Megatron Core 0.19's DDP, Megatron-FSDP and schedules; only these are modelled):
- DDP with the distributed optimizer, `ddp.overlap_grad_reduce` (the parallelism group sets it): each gradient
  bucket's reduce-scatter starts during the last micro-batch's backward (earlier ones run under no_sync); the last
  bucket, or what is longer than that backward, stays exposed. Off (`+bridge.ddp.overlap_grad_reduce=false`): all.
- `ddp.overlap_param_gather`: the updated parameters' all-gather runs bucket by bucket under the next step's first
  forward; the first bucket, or what is longer than that forward, stays exposed. Off: all.
- Megatron-FSDP (optim_grads_params): each unit's gather is prefetched under the previous unit's compute, forward
  and backward, and each micro-batch reduce-scatters its gradients behind the next units' backward: per micro-batch
  the first unit, or what the compute cannot cover, stays exposed.
- MoE all-to-alls, TP collectives and pipeline sends: exposed (overlap_moe_expert_parallel_comm is not supported by
  the Qwen-VL step; tp_comm_overlap and overlap_p2p_comm are off).
- Pipeline: 1F1B (interleaved under VPP) takes (m + (PP - 1)/VPP) times the slowest stage's micro-batch.
- The host: a tower's launches run ahead of its GPU work up to `host_hidden` (fitted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.check.speed import calibration, terms
from vlmtrain.config.world import bridge_section

if TYPE_CHECKING:
    from vlmtrain.check.speed.calibration import Calibration
    from vlmtrain.check.speed.workload import Workload
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

SPEED_JSON = "speed.json"
FORWARD_SHARE = 1 / 3
"""A micro-batch's forward is a third of its forward-backward time (backward: data and weight gradients, 2x)."""


@dataclass(frozen=True)
class StepTime:
    """Predicted seconds of one step on the slowest rank, term by term (they add up to `step_s`)."""

    vision: float
    """ViT + projector compute of every micro-batch (stage 0)."""
    decoder: float
    """Decoder compute (dense GEMMs, attention, experts) of every micro-batch on the slowest stage."""
    dispatch: float
    """MoE all-to-alls (dispatch + combine), exposed."""
    tensor_parallel: float
    """TP collectives, exposed."""
    fsdp: float
    """Megatron-FSDP gathers and reduce-scatters not hidden by compute."""
    vision_host: float
    """The ViT's host time its GPU work does not hide."""
    decoder_host: float
    """The decoder's host time its GPU work does not hide."""
    host: float
    """Host time per micro-batch outside the towers (embedding, MRoPE index, loss, the batch's copies)."""
    pipeline_bubble: float
    """(PP - 1)/VPP micro-batches of the slowest stage."""
    pipeline_p2p: float
    """Pipeline sends, exposed."""
    grad_reduce: float
    """DDP gradient reduce-scatter not hidden by the last backward."""
    param_gather: float
    """DDP parameter all-gather not hidden by the first forward."""
    optimizer: float
    """Adam's update (memory-bound) and the step's host work."""
    useful_tokens: float
    """Real tokens per step (the workload's)."""
    useful_flops: float
    """Useful FLOPs per step (the workload's, config.flops)."""
    world_size: int
    peak_tflops: float
    source: str
    """Where the workload came from."""

    @property
    def step_s(self) -> float:
        return sum(getattr(self, n) for n in TERMS)

    @property
    def useful_tokens_per_s_per_gpu(self) -> float:
        return self.useful_tokens / self.step_s / self.world_size

    @property
    def mfu(self) -> float:
        """Useful FLOPs over the step time and the dense BF16 peak of every GPU (config.flops.mfu's definition)."""
        return self.useful_flops / (self.step_s * self.world_size * self.peak_tflops * 1e12)

    def components(self) -> dict[str, float]:
        """The terms grouped as the run's timer splits a step (observe.timing): vision, decoder, optimizer and
        the rest (grad waits, pipeline, the host outside the towers)."""
        vision = self.vision + self.vision_host
        decoder = self.decoder + self.dispatch + self.tensor_parallel + self.fsdp + self.decoder_host
        return {"vision": vision, "decoder": decoder, "optimizer": self.optimizer,
                "other": self.step_s - vision - decoder - self.optimizer}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {n: round(getattr(self, n), 4) for n in TERMS}
        out.update(step_s=round(self.step_s, 4), useful_tokens_per_s_per_gpu=round(self.useful_tokens_per_s_per_gpu, 1),
                   mfu=round(self.mfu, 4), useful_tokens=self.useful_tokens, useful_flops=self.useful_flops,
                   world_size=self.world_size, peak_tflops=self.peak_tflops, source=self.source)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepTime:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


TERMS = ("vision", "vision_host", "decoder", "dispatch", "tensor_parallel", "fsdp", "decoder_host", "host",
         "pipeline_bubble", "pipeline_p2p", "grad_reduce", "param_gather", "optimizer")


def overlaps(run: RunConfig) -> tuple[bool, bool]:
    """(overlap_grad_reduce, overlap_param_gather) as Bridge gets them: the parallelism group sets both, a
    `+bridge.ddp.*` override wins."""
    ddp = bridge_section(run, "ddp")
    return bool(ddp.get("overlap_grad_reduce", True)), bool(ddp.get("overlap_param_gather", True))


def _stage(run: RunConfig, res: Resolved, w: Workload, stage: int, cal: Calibration) -> dict[str, float]:
    """One micro-batch of `stage`: each term's seconds after the overlaps inside the micro-batch."""
    f = terms.stage_flops(run, res, w, stage)
    vit, dec = terms.compute_s(run, res, stage, f, cal)
    dispatch = terms.dispatch_s(run, res, w, stage)
    tp = terms.tensor_parallel_s(run, res, w, stage)
    h_vit, h_dec, h_mb = terms.host_s(run, res, w, stage, cal)
    fsdp_raw = terms.fsdp_s(run, res, stage, w.vision)
    gpu = vit + dec + dispatch + tp
    fsdp = max(fsdp_raw / terms.fsdp_units(run, res, stage), fsdp_raw - gpu) if fsdp_raw else 0.0
    return {"vision": vit, "vision_host": terms.exposed_host(h_vit, vit, cal), "decoder": dec, "dispatch": dispatch,
            "tensor_parallel": tp, "fsdp": fsdp, "decoder_host": terms.exposed_host(h_dec, dec + dispatch + tp, cal),
            "host": h_mb}


def predict(run: RunConfig, res: Resolved, w: Workload, cal: Calibration | None = None) -> StepTime:
    """The step time of `run` on its resolved world for workload `w` (check.speed.workload.planned for a plan)."""
    cal = cal or calibration.load()
    lay = res.layout
    mb = terms.microbatches(res)
    stages = [_stage(run, res, w, s, cal) for s in range(lay.pp)]
    slow = max(range(lay.pp), key=lambda s: sum(stages[s].values()))
    per_mb = stages[slow]
    t_mb = sum(per_mb.values())
    bubble = (lay.pp - 1) / (lay.vpp or 1) * t_mb
    overlap_grads, overlap_params = overlaps(run)
    grads, n_buckets = terms.ddp_grad_s(run, res, slow, w.vision)
    gather = terms.ddp_gather_s(run, res, slow, w.vision)
    if overlap_grads:
        grads = max(grads / n_buckets, grads - (1 - FORWARD_SHARE) * t_mb)
    if overlap_params:
        gather = max(gather / n_buckets, gather - FORWARD_SHARE * t_mb)
    optimizer = max(terms.optimizer_s(run, res, s, w.vision, cal) for s in range(lay.pp)) + cal.step_host_s
    return StepTime(**{k: v * mb for k, v in per_mb.items()}, pipeline_bubble=bubble,
                    pipeline_p2p=terms.p2p_s(run, res, w) * mb, grad_reduce=grads, param_gather=gather,
                    optimizer=optimizer, useful_tokens=w.useful_tokens, useful_flops=w.flops.total,
                    world_size=lay.world_size, peak_tflops=run.hardware.peak_bf16_tflops, source=w.source)


def render(t: StepTime) -> list[str]:
    """The dry-run plan's speed section: the step time, useful tokens/s/GPU, MFU, then every term that costs."""
    items = "  ".join(f"{n} {getattr(t, n):.3f}" for n in TERMS if getattr(t, n) >= 0.0005)
    src = calibration.source()["source"]
    return [f"speed:    predicted step {t.step_s:.2f} s, {t.useful_tokens_per_s_per_gpu:.0f} useful tokens/s/GPU, "
            f"MFU {t.mfu:.1%} (check.speed, calibrated at {src['commit']}: held-out median error "
            f"{src['held_out_median_abs_error_pct']:.0f} %)",
            f"  s/step: {items}",
            f"  workload: {t.source}"]


def save(t: StepTime, run_dir: str | Path) -> Path:
    """`<run dir>/speed.json`: the prediction the run was launched with, which the report puts beside what it
    measured."""
    path = Path(run_dir) / SPEED_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(t.to_dict(), indent=1) + "\n")
    return path


def load(run_dir: str | Path) -> StepTime | None:
    """The run dir's speed.json, None when it has none (older runs)."""
    path = Path(run_dir) / SPEED_JSON
    try:
        return StepTime.from_dict(json.loads(path.read_text())) if path.is_file() else None
    except (ValueError, KeyError, TypeError):
        return None
