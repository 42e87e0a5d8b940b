"""model group: the architecture, built in code from published dimensions (no hub access, random init).

| option             | decoder                                   | experts     | ViT                         |
|--------------------|-------------------------------------------|-------------|-----------------------------|
| tiny               | 4 x 256, 4 heads / 2 KV                   | 8, top-2    | 2 x 128, deepstack [0, 1]   |
| qwen3_vl_30b_a3b   | 48 x 2048, 32 heads / 4 KV, head 128      | 128, top-8  | 27 x 1152, deepstack 8/16/24 |
| qwen3_vl_235b_a22b | 94 x 4096, 64 heads / 4 KV, head 128      | 128, top-8  | 27 x 1152, deepstack 8/16/24 |
| qwen35_vl_35b_a3b  | 40 x 2048, GDN 3:1 attention, 16 / 2 KV    | 256, top-8 +shared | 27 x 1152, no deepstack |
| tiny_qwen35        | 4 x 256, GDN 3:1 attention, 4 / 2 KV      | 8, top-2 +shared | 2 x 128, no deepstack     |

`model.hf_path=<dir>` starts from a local Hugging Face checkpoint (config.hf_checkpoint): the provider is built from
the dir's config.json, its weights load through Bridge's `checkpoint.pretrained_checkpoint` (after the DDP/FSDP
wrap, so on every layout, FSDP's meta-device init included), the tokenizer and processor come from the dir when it
has them (else vlmtrain's offline processor), HF_HUB_OFFLINE=1 is exported, and preflight refuses a model group
field that differs from the dir's config.json (pick the matching model option and override num_layers etc.).

`model.num_layers=N` reduces decoder depth for benchmarking while keeping every layer's shape (Qwen3-VL needs
N >= its deepstack layers, or fewer `model.vit.deepstack_indexes`: preflight says so). The HF config goes through
Megatron Bridge's own AutoBridge mapping (the path real checkpoints use), so the provider is the exact one Bridge
would build for the published model.

Qwen3.5's Gated-DeltaNet layers run flash-linear-attention (FLA) kernels that are compiled on first use: Triton
(autotuned), TileLang through nvcc (FLA's gated chunk backward on Hopper, where Triton < 3.7.1 computes it wrongly)
and torch.compile'd Megatron helpers. Step 1 of a fresh run spent 214-217 s there on the H200
(results/gpu_acceptance.jsonl), so `env()` puts every one of those caches under `kernels.cache_dir` (default
`data.cache_dir`/kernels), where later runs find them, and pins FLA's TileLang backend on SM90 (FLA_TILELANG=1; FLA
also picks it there by default once tilelang and nvcc are present). Every family's Megatron helpers (router,
dispatcher, fused activations) are torch.compile'd too, so TorchInductor's and Triton's caches go there for every
model: a run on a fresh machine whose cache dir persisted (a tune's, `vlmtrain tune --cache-dir`) compiles nothing
again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vlmtrain.config.architecture import Family, LinearAttentionConfig

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

BUILDS = frozenset({"model"})
"""The section this group constructs (build_provider: the Bridge model provider) before any group's apply() runs;
the other groups then write their OWNS fields into it, so none of theirs is this group's."""
OWNS = frozenset(
    {
        "model.seq_length",
        "model.apply_rope_fusion",
        "checkpoint.pretrained_checkpoint",
    }
)


@dataclass
class VitConfig:
    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    deepstack_indexes: list[int] = field(default_factory=list)
    """ViT layers feeding deepstack mergers (Qwen3-VL); each must be < depth."""


@dataclass
class ModelConfig:
    name: str = "tiny"
    family: Family = Family.qwen3_vl
    num_layers: int = 4
    """Decoder layers (override to reduce depth for benchmarks)."""
    hidden_size: int = 256
    num_attention_heads: int = 4
    num_query_groups: int = 2
    """KV heads; TP must divide it."""
    head_dim: int = 64
    num_experts: int = 8
    moe_topk: int = 2
    moe_ffn_hidden_size: int = 128
    shared_expert_ffn_hidden_size: int = 0
    vocab_size: int = 151936
    rope_theta: float = 5_000_000.0
    mrope_section: list[int] = field(default_factory=lambda: [12, 10, 10])
    """mRoPE (t, h, w) split; sums to head_dim/2 (Qwen3.5: head_dim*0.25/2)."""
    vit: VitConfig = field(default_factory=VitConfig)
    linear_attention: LinearAttentionConfig | None = None
    """Qwen3.5 only."""
    hf_path: str | None = None
    """A local Hugging Face checkpoint dir to start from (its config must match these fields; preflight checks)."""


def hf_config(m: ModelConfig, ids: Mapping[str, int]) -> Any:
    """The transformers config of the architecture, with the special-token ids of the tokenizer the data is
    processed with (vlmtrain.data.processor.vision_token_ids). Shapes and layer pattern: config.architecture."""
    from vlmtrain.config import architecture as arch

    vision = dict(
        depth=m.vit.depth,
        hidden_size=m.vit.hidden_size,
        intermediate_size=m.vit.intermediate_size,
        num_heads=m.vit.num_heads,
        out_hidden_size=m.hidden_size,
        patch_size=arch.PATCH_SIZE,
        temporal_patch_size=arch.TEMPORAL_PATCH_SIZE,
        spatial_merge_size=arch.SPATIAL_MERGE_SIZE,
        num_position_embeddings=arch.VIT_POSITION_EMBEDDINGS,
    )
    text = dict(
        vocab_size=m.vocab_size,
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_query_groups,
        head_dim=m.head_dim,
        num_experts=m.num_experts,
        num_experts_per_tok=m.moe_topk,
        moe_intermediate_size=m.moe_ffn_hidden_size,
        bos_token_id=ids["bos_token_id"],
        eos_token_id=ids["eos_token_id"],
        tie_word_embeddings=False,
    )
    top = {k: ids[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}
    if m.family == Family.qwen3_vl:
        from transformers import Qwen3VLMoeConfig

        text.update(
            intermediate_size=m.moe_ffn_hidden_size * m.moe_topk,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": m.rope_theta,
                "mrope_section": list(m.mrope_section),
                "mrope_interleaved": True,
            },
        )
        vision["deepstack_visual_indexes"] = list(m.vit.deepstack_indexes)
        cfg = Qwen3VLMoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **top)
        cfg.architectures = ["Qwen3VLMoeForConditionalGeneration"]
        return cfg
    from transformers import Qwen3_5MoeConfig

    la = arch.linear_attention(m)
    assert la is not None
    text.update(
        shared_expert_intermediate_size=m.shared_expert_ffn_hidden_size,
        linear_key_head_dim=la.key_head_dim,
        linear_value_head_dim=la.value_head_dim,
        linear_num_key_heads=la.num_key_heads,
        linear_num_value_heads=la.num_value_heads,
        layer_types=arch.layer_types(m),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": m.rope_theta,
            "partial_rotary_factor": arch.QWEN35_PARTIAL_ROTARY_FACTOR,
            "mrope_section": list(m.mrope_section),
            "mrope_interleaved": True,
        },
    )
    cfg = Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **top)
    cfg.architectures = ["Qwen3_5MoeForConditionalGeneration"]
    return cfg


def build_provider(run: RunConfig, token_ids: Mapping[str, int]) -> Any:
    """Megatron Bridge's model provider for the architecture (AutoBridge.from_hf_config, no weights: a
    `model.hf_path` checkpoint's weights load after the wrap, see apply)."""
    from megatron.bridge import AutoBridge

    if run.model.hf_path:
        from vlmtrain.config import hf_checkpoint

        hf = hf_checkpoint.hf_config(run.model.hf_path)
        mrope = list(hf.text_config.rope_parameters["mrope_section"])
    else:
        hf, mrope = hf_config(run.model, token_ids), list(run.model.mrope_section)
    provider = AutoBridge.from_hf_config(hf).to_megatron_provider(load_weights=False)
    if run.model.family == Family.qwen35_vl:
        provider.mrope_section = mrope  # its bridge reads only rope_scaling
        require_gdn_backward()
    return provider


def require_gdn_backward() -> None:
    """On Hopper with Triton 3.4-3.7.0, FLA runs the gated chunk backward only through TileLang (tilelang installed,
    nvcc found, FLA_TILELANG not 0) and otherwise raises at the first backward, after minutes of kernel
    compilation: check FLA's own condition when the model is built instead. No-op without a GPU (dry runs)."""
    import torch

    if not torch.cuda.is_available():
        return
    from fla.backends import TileLangBackend
    from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1

    if IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1 and not TileLangBackend.can_use():
        raise RuntimeError(
            "model=qwen35_vl_* on Hopper: FLA refuses its gated chunk backward under this Triton (< 3.7.1) unless "
            "TileLang can run it, and it cannot here: install the locked tilelang (bash scripts/setup_env.sh), put "
            "nvcc on PATH or set CUDA_HOME, and leave FLA_TILELANG unset or 1."
        )


def env(run: RunConfig) -> dict[str, str]:
    """HF_HUB_OFFLINE=1 with `model.hf_path` (the dir is the only source); where JIT-compiled kernels are cached
    (persistent, kernels.cache_root): every family's Megatron helpers are torch.compile'd (router, dispatcher, fused
    activations: TorchInductor and Triton), Qwen3.5's Gated-DeltaNet kernels too (TileLang, autotuned Triton) and, on
    SM90, FLA's TileLang backend (see the module docstring); the launcher exports these (Resolved.env)."""
    from vlmtrain.config.groups.kernels import cache_root

    kernels = cache_root(run)
    out = {"HF_HUB_OFFLINE": "1"} if run.model.hf_path else {}
    out |= {"TRITON_CACHE_DIR": str(kernels / "triton"), "TORCHINDUCTOR_CACHE_DIR": str(kernels / "inductor")}
    if run.model.family != Family.qwen35_vl:
        return out
    out |= {
        "TILELANG_CACHE_DIR": str(kernels / "tilelang"),
        "TRITON_CACHE_AUTOTUNING": "1",  # FLA autotunes its Triton kernels; keep the choices with the kernels
    }
    if run.hardware.sm_major == 9:
        out["FLA_TILELANG"] = "1"
    return out


def apply(run: RunConfig, res: Resolved, cfg: ConfigContainer) -> None:
    cfg.model.seq_length = res.seq_length  # a packed run's row: CUDA graphs and pipeline buffers are capacity x 1
    # mRoPE has no fused kernel in Bridge (its runtime assert): kernels.rope replaces its path
    cfg.model.apply_rope_fusion = False
    if run.model.hf_path:  # Bridge loads an HF dir after the DDP/FSDP wrap; a checkpoint.load resume wins over it
        cfg.checkpoint.pretrained_checkpoint = run.model.hf_path
