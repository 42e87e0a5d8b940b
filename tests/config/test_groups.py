"""Every option of every group writes the expected fields on the real, Bridge-finalized ConfigContainer (TABLE).
What apply() may write (OWNS, SWAPS) and the frozen option list (FROZEN_OPTIONS): test_group_apply.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmtrain.build import container, target
from vlmtrain.check import preflight
from vlmtrain.config.resolve import resolve

# (overrides, {bridge field path: expected value after Bridge's finalization})
TABLE: list[tuple[list[str], dict[str, object]]] = [
    (
        ["parallelism=fsdp"],
        {
            "ddp.use_megatron_fsdp": True,
            "dist.use_megatron_fsdp": True,
            "ddp.data_parallel_sharding_strategy": "optim_grads_params",
            "checkpoint.ckpt_format": "fsdp_dtensor",
            "model.tensor_model_parallel_size": 1,
            "model.pipeline_model_parallel_size": 1,
            "model.context_parallel_size": 1,
            "model.expert_model_parallel_size": 8,
            "model.expert_tensor_parallel_size": 1,
            "model.init_model_with_meta_device": True,
            "ddp.average_in_collective": False,
            "data_parallel_size": 8,
        },
    ),
    (
        ["parallelism=3d", "parallelism.tp=2", "parallelism.pp=2", "parallelism.ep=2"],
        {
            "ddp.use_megatron_fsdp": False,
            "dist.use_megatron_fsdp": False,
            "checkpoint.ckpt_format": "torch_dist",
            "model.tensor_model_parallel_size": 2,
            "model.pipeline_model_parallel_size": 2,
            "model.expert_model_parallel_size": 2,
            "model.sequence_parallel": True,
            "ddp.use_distributed_optimizer": True,
            "data_parallel_size": 2,
        },
    ),
    (
        ["parallelism=3d", "parallelism.ep=4", "parallelism.etp=2"],
        {"model.expert_model_parallel_size": 4, "model.expert_tensor_parallel_size": 2},
    ),
    (
        ["hardware=gb200"],
        {
            "env_vars.CUDA_DEVICE_MAX_CONNECTIONS": "32",
            "env_vars.NCCL_GRAPH_REGISTER": "0",
            "model.moe_token_dispatcher_type": "flex",
            "model.moe_flex_dispatcher_backend": "hybridep",
            "env_vars.USE_MNNVL": "1",
            "env_vars.NVLINK_DOMAIN_SIZE": "72",
            "env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "4",
            "data_parallel_size": 4,
        },
    ),
    (["hardware=b200"], {"env_vars.NVTE_FWD_LAYERNORM_SM_MARGIN": "20", "model.moe_token_dispatcher_type": "alltoall"}),
    (["hardware=h100"], {"env_vars.CUDA_DEVICE_MAX_CONNECTIONS": "32", "model.moe_token_dispatcher_type": "alltoall"}),
    (["hardware=h200"], {"env_vars.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    (
        ["dispatcher=alltoall"],
        {"model.moe_token_dispatcher_type": "alltoall", "model.moe_flex_dispatcher_backend": None},
    ),
    (
        ["dispatcher=hybridep", "nodes=2", "train.global_batch_size=16"],
        {
            "model.moe_token_dispatcher_type": "flex",
            "model.moe_flex_dispatcher_backend": "hybridep",
            "model.moe_flex_dispatcher_num_sms": 32,
            "model.moe_shared_expert_overlap": False,
            "env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "8",
            "env_vars.NVLINK_DOMAIN_SIZE": "8",
            "env_vars.USE_MNNVL": "0",
        },
    ),
    (
        ["dispatcher=deepep"],
        {
            "model.moe_token_dispatcher_type": "flex",
            "model.moe_flex_dispatcher_backend": "deepep",
            "model.moe_flex_dispatcher_num_sms": 20,
        },
    ),
    (["dispatcher=auto"], {"model.moe_token_dispatcher_type": "alltoall"}),
    (
        ["recompute=none"],
        {
            "model.recompute_granularity": None,
            "model.recompute_modules": [],
            "model.recompute_method": None,
            "model.recompute_num_layers": None,
        },
    ),
    (
        ["recompute=selective"],
        {"model.recompute_granularity": "selective", "model.recompute_modules": ["core_attn", "moe_act", "layernorm"]},
    ),
    (  # the default before check.defaults settles it (a run resolved without placement): no recompute
        ["recompute=auto"],
        {"model.recompute_granularity": None, "model.recompute_modules": [], "model.recompute_method": None},
    ),
    (  # the defaults' second memory relief: the whole MoE block recomputed from its input
        ["recompute=selective", "recompute.modules=[core_attn,layernorm,moe]"],
        {"model.recompute_granularity": "selective", "model.recompute_modules": ["core_attn", "layernorm", "moe"]},
    ),
    (
        ["recompute=full", "vision=frozen_with_projector"],  # preflight: full recompute needs the projector frozen
        {"model.recompute_granularity": "full", "model.recompute_method": "uniform", "model.recompute_num_layers": 1},
    ),
    (
        ["cuda_graph=none"],
        {"model.cuda_graph_impl": "none", "model.cuda_graph_modules": [], "rng.te_rng_tracker": False},
    ),
    (
        ["cuda_graph=moe_router_preprocess"],
        {
            "model.cuda_graph_impl": "transformer_engine",
            "model.cuda_graph_modules": ["moe_router", "moe_preprocess"],
            "rng.te_rng_tracker": True,
            "model.use_te_rng_tracker": True,
            "dataset.pad_to_max_length": True,
            "env_vars.NCCL_GRAPH_REGISTER": "0",
        },
    ),
    (
        ["cuda_graph=attn_moe_router_preprocess", "model=qwen35_vl_35b_a3b"],
        {
            "model.cuda_graph_impl": "transformer_engine",
            "model.cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"],
        },
    ),
    (
        ["vision=trainable"],
        {
            "model.freeze_vision_model": False,
            "model.freeze_vision_projection": False,
            "model.freeze_language_model": False,
        },
    ),
    (
        ["vision=frozen"],
        {
            "model.freeze_vision_model": True,
            "model.freeze_vision_projection": False,
            "model.freeze_language_model": False,
        },
    ),
    (
        ["vision=frozen_with_projector"],
        {
            "model.freeze_vision_model": True,
            "model.freeze_vision_projection": True,
            "model.freeze_language_model": False,
        },
    ),
    (
        ["model=tiny"],
        {
            "model.num_layers": 4,
            "model.hidden_size": 256,
            "model.num_moe_experts": 8,
            "model.moe_router_topk": 2,
            "model.vision_config.depth": 2,
            "model.seq_length": 4096,
        },
    ),
    (
        ["model=qwen3_vl_30b_a3b"],
        {
            "model.num_layers": 48,
            "model.hidden_size": 2048,
            "model.num_attention_heads": 32,
            "model.num_query_groups": 4,
            "model.kv_channels": 128,
            "model.num_moe_experts": 128,
            "model.moe_router_topk": 8,
            "model.moe_ffn_hidden_size": 768,
            "model.vision_config.depth": 27,
            "model.vision_config.out_hidden_size": 2048,
            "model.mrope_section": [24, 20, 20],
            "model.gradient_accumulation_fusion": False,
            "model.apply_rope_fusion": False,
        },
    ),
    (
        # the 3:1 Gated-DeltaNet pattern at test size, GDN head dims of the published model
        ["model=tiny_qwen35"],
        {
            "model.num_layers": 4,
            "model.hidden_size": 256,
            "model.num_moe_experts": 8,
            "model.experimental_attention_variant": "gated_delta_net",
            "model.linear_attention_freq": [1, 1, 1, 0],  # 3 GDN, then full attention
            "model.linear_key_head_dim": 128,
            "model.vision_config.depth": 2,
        },
    ),
    (
        # Megatron's torch.compile'd helpers (every family) cache their compiled kernels under data.cache_dir
        ["model=qwen3_vl_30b_a3b", "model.num_layers=8"],
        {
            "model.num_layers": 8,
            "model.vision_config.depth": 27,
            "env_vars.TORCHINDUCTOR_CACHE_DIR": str(Path("~/.cache/vlmtrain/kernels/inductor").expanduser()),
            "env_vars.TRITON_CACHE_DIR": str(Path("~/.cache/vlmtrain/kernels/triton").expanduser()),
        },
    ),
    (
        ["model=qwen3_vl_235b_a22b", "nodes=4", "train.global_batch_size=32", "preflight.ignore=[memory_fits]"],
        {
            "model.num_layers": 94,
            "model.hidden_size": 4096,
            "model.num_attention_heads": 64,
            "model.moe_ffn_hidden_size": 1536,
        },
    ),
    (
        ["model=qwen35_vl_35b_a3b"],
        {
            "model.num_layers": 40,
            "model.num_moe_experts": 256,
            "model.moe_shared_expert_intermediate_size": 512,
            "model.mrope_section": [11, 11, 10],
            "model.experimental_attention_variant": "gated_delta_net",
            # its JIT-compiled kernels cache under data.cache_dir; FLA's TileLang backward on SM90 (h200)
            "env_vars.TILELANG_CACHE_DIR": str(Path("~/.cache/vlmtrain/kernels/tilelang").expanduser()),
            "env_vars.TRITON_CACHE_DIR": str(Path("~/.cache/vlmtrain/kernels/triton").expanduser()),
            "env_vars.FLA_TILELANG": "1",
        },
    ),
    (
        # kernels.cache_dir moves every compiled-kernel cache (a cluster's shared filesystem); data's cache stays
        ["model=qwen35_vl_35b_a3b", "kernels.cache_dir=/shared/vlmtrain-kernels"],
        {
            "env_vars.TILELANG_CACHE_DIR": "/shared/vlmtrain-kernels/tilelang",
            "env_vars.TRITON_CACHE_DIR": "/shared/vlmtrain-kernels/triton",
            "env_vars.TORCHINDUCTOR_CACHE_DIR": "/shared/vlmtrain-kernels/inductor",
        },
    ),
    (["data=mock"], {"dataset.num_images": 1, "dataset.image_size": (256, 256)}),
    (["data=sample"], {"dataset.source.path_or_dataset": "json", "dataset.hf_processor_path": "<processor>",
                       "dataset.do_validation": False, "dataset.validation_source": None,
                       "validation.eval_interval": None, "validation.eval_iters": 0}),
    (  # half of the 16 photos held out: Bridge's own validation split, evaluated every 5 steps on 2 batches of 8
        ["data=sample", "data.validation_fraction=0.5", "train.eval_interval=5", "train.eval_iters=2"],
        {"dataset.do_validation": True, "dataset.validation_source.path_or_dataset": "json",
         "validation.eval_interval": 5, "validation.eval_iters": 2, "validation.eval_global_batch_size": 8,
         "validation.eval_micro_batch_size": 1},
    ),
    (["data=realistic", "data.payload.num_samples=8"], {"dataset.source.path_or_dataset": "json"}),
    (["data=hf", "data.path=cord_v2"], {"dataset.source.dataset_name": "cord_v2"}),
    (
        [
            "train.micro_batch_size=2",
            "train.global_batch_size=32",
            "train.seq_length=2048",
            "train.iterations=50",
            "train.lr=3e-4",
        ],
        {
            "train.micro_batch_size": 2,
            "train.global_batch_size": 32,
            "model.seq_length": 2048,
            "dataset.seq_length": 2048,
            "train.train_iters": 50,
            "optimizer.lr": 3e-4,
            "scheduler.lr_decay_iters": 50,
        },
    ),
    (
        ["kernels=default"],
        {"model.moe_router_fusion": False, "model.cross_entropy_fusion_impl": "native", "model.moe_grouped_gemm": True},
    ),
    (  # the default before check.defaults settles it (a run resolved without placement): Bridge's kernels, FSDP
        ["kernels=auto", "parallelism=auto"],
        {"model.moe_router_fusion": False, "model.cross_entropy_fusion_impl": "native",
         "model.gradient_accumulation_fusion": False, "ddp.use_megatron_fsdp": True, "model.seq_length": 4096},
    ),
    (
        ["kernels=fast", "hardware=h100"],
        {"model.moe_router_fusion": True, "model.cross_entropy_fusion_impl": "te",
         "env_vars.NVTE_USE_CUTLASS_GROUPED_GEMM": "1"},
    ),
    (
        ["train.profile_step=5", "train.iterations=8"],
        {"profiling.use_pytorch_profiler": True, "profiling.profile_step_start": 5, "profiling.profile_step_end": 6,
         "profiling.profile_ranks": [0], "profiling.pytorch_profiler_collect_callstack": False},
    ),
    (  # Python stacks only on request: unwinding one per op stretches the profiled step's host side
        ["train.profile_step=5", "train.iterations=8", "train.profile_stacks=true"],
        {"profiling.pytorch_profiler_collect_callstack": True},
    ),
    (  # Megatron's fatal NaN/Inf checks (loss per micro-batch, local grads before the DP reduce), no grad scaler
        ["train.on_nonfinite=stop"],
        {"rerun_state_machine.check_for_nan_in_loss": True, "ddp.check_for_nan_in_grad": True,
         "optimizer.loss_scale": None},
    ),
    (  # stop_at_step_end: Megatron's checks (host syncs) off, no grad scaler: the metrics callback checks
        ["train.on_nonfinite=stop_at_step_end"],
        {"rerun_state_machine.check_for_nan_in_loss": False, "ddp.check_for_nan_in_grad": False,
         "optimizer.loss_scale": None},
    ),
    (  # wgrad_fusion: Megatron's gradient-accumulation fusion on (off otherwise: it needs APEX without vlmtrain's)
        ["kernels.wgrad_fusion=true"],
        {"model.gradient_accumulation_fusion": True},
    ),
    (
        ["kernels=fast"],
        {"model.gradient_accumulation_fusion": False},
    ),
    (  # precision-aware optimizer: TE's FusedAdam on BF16 weights + remainders (the distributed optimizer stays on)
        ["precision.precision_aware_optimizer=true"],
        {"optimizer.use_precision_aware_optimizer": True, "optimizer.use_distributed_optimizer": True},
    ),
    (  # skip: the checks off, Megatron's ConstantGradScaler(1.0) finds Inf/NaN grads and skips the update
        ["train.on_nonfinite=skip"],
        {"rerun_state_machine.check_for_nan_in_loss": False, "ddp.check_for_nan_in_grad": False,
         "optimizer.loss_scale": 1.0},
    ),
    (
        ["+bridge.model.moe_aux_loss_coeff=0.0", "+bridge.train.manual_gc_interval=7"],
        {"model.moe_aux_loss_coeff": 0.0, "train.manual_gc_interval": 7},
    ),
    (
        ["experiment=fsdp_first_gb200"],
        {"model.num_layers": 94, "model.expert_model_parallel_size": 64, "ddp.use_megatron_fsdp": True,
         "model.recompute_granularity": "full", "model.freeze_vision_projection": True,
         "model.moe_flex_dispatcher_backend": "hybridep", "data_parallel_size": 64,
         "env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "64"},
    ),
    (
        ["experiment=3d_gb200"],
        {"model.expert_model_parallel_size": 64, "ddp.use_megatron_fsdp": False, "model.recompute_granularity": "full",
         "model.cuda_graph_impl": "none", "train.global_batch_size": 1024, "data_parallel_size": 64},
    ),
    (  # written by `vlmtrain tune` on one H200 (docs/benchmarks.md): DP alone, packed rows, fast kernels
        ["experiment=tune_h1"],
        {"model.expert_model_parallel_size": 1, "ddp.use_megatron_fsdp": False, "data_parallel_size": 1,
         "model.seq_length": 12288, "model.num_layers": 4, "train.global_batch_size": 4,
         "model.moe_router_fusion": True, "model.moe_token_dispatcher_type": "alltoall",
         "env_vars.NVTE_USE_CUTLASS_GROUPED_GEMM": "1"},
    ),
]


def get(cfg: object, path: str) -> object:
    obj = cfg
    for part in path.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    if isinstance(obj, list):
        return [getattr(x, "name", x) for x in obj]
    return obj


@pytest.mark.parametrize(("overrides", "expected"), TABLE, ids=[" ".join(o) for o, _ in TABLE])
def test_option_sets_bridge_fields(compose, bridge, overrides, expected, tmp_path):
    run = compose(*overrides, output_dir=str(tmp_path))
    res = resolve(run)
    assert not preflight.errors(preflight.check(run, res))
    cfg = container.build(run, res)
    target.finalize(run, res, cfg)
    for path, value in expected.items():
        if value == "<processor>":
            assert Path(get(cfg, path)).is_dir(), path
        else:
            assert get(cfg, path) == value, f"{path}: {get(cfg, path)!r} != {value!r}"
