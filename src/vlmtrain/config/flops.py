"""vlmtrain's own FLOPs and throughput: real (non-pad) lengths, every image of multi-image samples, ViT +
projector + decoder, and a freeze-aware backward. MFU is against the hardware group's dense BF16 peak.

Per forward pass (multiply-add = 2 FLOPs):
- decoder, per token and layer: attention projections 2h(nq*d + 2*nkv*d) + 2(nq*d)h; MoE router 2hE,
  routed experts topk * 6*h*f (gated: 3 matrices), shared expert 6*h*fs; Qwen3.5 Gated-DeltaNet layers
  replace attention by projections 2h(2*nk*dk + 2*nv*dv + 2*nv) + 2*nv*dv*h and a recurrence 4*nv*dk*dv;
  causal self-attention adds 2*nq*d*s^2 per sequence (half of the full s^2 matrix); logits 2*h*V per token.
- ViT, per image with P patches: patch embedding 2*P*1536*hv; per layer 2P*hv*3hv + 2P*hv^2 + 4P*hv*iv and
  bidirectional attention 4*P^2*hv; patch merger (and each deepstack merger) 2(P/4)(4hv)^2 + 2(P/4)(4hv)h.
Shapes and the Qwen3.5 layer pattern: vlmtrain.config.architecture.
Backward = 2x forward for a trainable part (data + weight gradients); a frozen part behind trainable ones
needs only its data gradient (1x); a frozen part with nothing trainable upstream has no backward.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vlmtrain.config import architecture as arch

if TYPE_CHECKING:
    from vlmtrain.config.groups.model import ModelConfig
    from vlmtrain.config.schema import RunConfig


@dataclass(frozen=True)
class Flops:
    vit: float
    projector: float
    decoder: float

    @property
    def total(self) -> float:
        return self.vit + self.projector + self.decoder


def decoder_forward(m: ModelConfig, lengths: Iterable[int]) -> float:
    h, d, nq = m.hidden_size, m.head_dim, m.num_attention_heads
    q, kv = arch.attention_widths(m)
    moe = 2 * h * m.num_experts + m.moe_topk * 6 * h * m.moe_ffn_hidden_size + 6 * h * m.shared_expert_ffn_hidden_size
    attn_proj = 2 * h * (q + 2 * kv) + 2 * q * h
    n_linear = sum(t == "linear_attention" for t in arch.layer_types(m))
    n_full, lin = m.num_layers - n_linear, 0.0
    la = arch.linear_attention(m)
    if la is not None:
        qk, v = arch.gdn_widths(la)
        nv, dk, dv = la.num_value_heads, la.key_head_dim, la.value_head_dim
        lin = 2 * h * (2 * qk + 2 * v + 2 * nv) + 2 * v * h + 4 * nv * dk * dv
    per_token = n_full * attn_proj + n_linear * lin + m.num_layers * moe + 2 * h * m.vocab_size
    total = 0.0
    for s in lengths:
        total += s * per_token + n_full * 2 * nq * d * s * s
    return total


def vit_forward(m: ModelConfig, patches: Iterable[int]) -> tuple[float, float]:
    """(ViT blocks + patch embedding, projector = merger + deepstack mergers) forward FLOPs."""
    v = m.vit
    hv, iv = v.hidden_size, v.intermediate_size
    blocks = projector = 0.0
    n_mergers, merged = 1 + len(v.deepstack_indexes), arch.PATCHES_PER_TOKEN * hv  # merger input: 2x2 patches
    for p in patches:
        per_layer = 2 * p * hv * 3 * hv + 2 * p * hv * hv + 4 * p * hv * iv + 4 * p * p * hv
        blocks += 2 * p * arch.VIT_PATCH_INPUT * hv + v.depth * per_layer
        tokens = p / arch.PATCHES_PER_TOKEN
        projector += n_mergers * (2 * tokens * merged**2 + 2 * tokens * merged * m.hidden_size)
    return blocks, projector


def _backward_factor(trainable: bool, needs_data_grad: bool) -> float:
    return 2.0 if trainable else (1.0 if needs_data_grad else 0.0)


def backward_factors(run: RunConfig) -> tuple[float, float, float]:
    """Backward FLOPs per forward FLOP of (ViT, projector, decoder) under the run's freezes."""
    vis = run.vision
    vit_train = not vis.freeze_vision_model
    proj_train = not vis.freeze_vision_projection
    return (_backward_factor(vit_train, False), _backward_factor(proj_train, vit_train),
            _backward_factor(not vis.freeze_language_model, vit_train or proj_train))


def step_flops(run: RunConfig, samples: Iterable[dict[str, Any]]) -> Flops:
    """Model FLOPs of fwd+bwd over these samples (each: non-pad `len`, `patches` per image)."""
    samples = list(samples)
    m = run.model
    dec_f = decoder_forward(m, (s["len"] for s in samples))
    vit_f, proj_f = vit_forward(m, (p for s in samples for p in s["patches"]))
    vit_b, proj_b, dec_b = backward_factors(run)
    return Flops(vit=vit_f * (1 + vit_b), projector=proj_f * (1 + proj_b), decoder=dec_f * (1 + dec_b))


def mfu(flops: float, step_s: float, world_size: int, peak_tflops: float) -> float:
    return flops / (step_s * world_size * peak_tflops * 1e12)
