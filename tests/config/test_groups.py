"""Every option of every group writes the expected fields on the real, Bridge-finalized ConfigContainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlmtrain.build import container, target
from vlmtrain.check import preflight
from vlmtrain.config import groups

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
    (["model=qwen3_vl_30b_a3b", "model.num_layers=8"], {"model.num_layers": 8, "model.vision_config.depth": 27}),
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
    (["data=mock"], {"dataset.num_images": 1, "dataset.image_size": (256, 256)}),
    (["data=sample"], {"dataset.source.path_or_dataset": "json", "dataset.hf_processor_path": "<processor>"}),
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
    (
        ["kernels=fast", "hardware=h100"],
        {"model.moe_router_fusion": True, "model.cross_entropy_fusion_impl": "te",
         "env_vars.NVTE_USE_CUTLASS_GROUPED_GEMM": "1"},
    ),
    (
        ["train.profile_step=5", "train.iterations=8"],
        {"profiling.use_pytorch_profiler": True, "profiling.profile_step_start": 5, "profiling.profile_step_end": 6,
         "profiling.profile_ranks": [0], "profiling.pytorch_profiler_collect_callstack": True},
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
        {
            "model.num_layers": 94,
            "model.expert_model_parallel_size": 64,
            "ddp.use_megatron_fsdp": True,
            "model.recompute_granularity": "full",
            "model.freeze_vision_projection": True,
            "model.moe_flex_dispatcher_backend": "hybridep",
            "data_parallel_size": 64,
            "env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "64",
        },
    ),
    (
        ["experiment=3d_gb200"],
        {
            "model.expert_model_parallel_size": 64,
            "ddp.use_megatron_fsdp": False,
            "model.recompute_granularity": "full",
            "model.cuda_graph_impl": "none",
            "train.global_batch_size": 1024,
            "data_parallel_size": 64,
        },
    ),
    (  # written by `vlmtrain tune` on one H200 (docs/benchmarks.md): DP alone, packed rows, fast kernels
        ["experiment=tune_h1"],
        {
            "model.expert_model_parallel_size": 1,
            "ddp.use_megatron_fsdp": False,
            "data_parallel_size": 1,
            "model.seq_length": 12288,
            "model.num_layers": 4,
            "train.global_batch_size": 4,
            "model.moe_router_fusion": True,
            "model.moe_token_dispatcher_type": "alltoall",
            "env_vars.NVTE_USE_CUTLASS_GROUPED_GEMM": "1",
        },
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
    assert not preflight.errors(preflight.check(run))
    cfg = container.build(run)
    target.finalize(run, cfg)
    for path, value in expected.items():
        if value == "<processor>":
            assert Path(get(cfg, path)).is_dir(), path
        else:
            assert get(cfg, path) == value, f"{path}: {get(cfg, path)!r} != {value!r}"


def covers(owned: str, path: str) -> bool:
    """Whether owning the Bridge field path `owned` means owning `path`: the same path, or a dotted prefix of it
    (`model` covers `model.num_layers`; `model.x` does not cover `model.xy`)."""
    return path == owned or path.startswith(owned + ".")


def overlaps(owns: dict[str, frozenset[str]]) -> list[str]:
    """Every pair of groups (by name) whose OWNS meet: one group's path equals or is a dotted prefix of another's."""
    names = sorted(owns)
    return [f"{a}:{p} / {b}:{q}" for i, a in enumerate(names) for b in names[i + 1:]
            for p in sorted(owns[a]) for q in sorted(owns[b]) if covers(p, q) or covers(q, p)]


def test_owns_sets_are_disjoint():
    assert overlaps({groups.group_name(g): g.OWNS for g in groups.GROUPS}) == []


def test_a_planted_prefix_overlap_is_caught():
    planted = {"a": frozenset({"model"}), "b": frozenset({"model.num_layers"})}
    assert overlaps(planted) == ["a:model / b:model.num_layers"]
    assert overlaps({"a": frozenset({"env_vars.X"}), "b": frozenset({"env_vars"}), "c": frozenset({"rng.seed"})}) \
        == ["a:env_vars.X / b:env_vars"]
    assert overlaps({"a": frozenset({"mixed_precision"}), "b": frozenset({"mixed_precision"})}) != []
    assert overlaps({"a": frozenset({"model.x"}), "b": frozenset({"model.xy", "modelx"})}) == []  # no dotted prefix


# Every group and each group's options (conf/<group>/*.yaml), frozen: a new group or option fails here until it is
# added to this literal, and with it to TABLE and SWAPS (docs/architecture.md, "Adding a config group").
FROZEN_OPTIONS: dict[str, tuple[str, ...]] = {
    "model": ("qwen35_vl_35b_a3b", "qwen3_vl_235b_a22b", "qwen3_vl_30b_a3b", "tiny"),
    "data": ("energon", "hf", "jsonl", "mock", "parquet", "realistic", "sample"),
    "parallelism": ("3d", "fsdp"),
    "hardware": ("b200", "gb200", "h100", "h200"),
    "dispatcher": ("alltoall", "auto", "deepep", "hybridep"),
    "recompute": ("full", "none", "selective"),
    "cuda_graph": ("attn_moe_router_preprocess", "moe_router_preprocess", "none"),
    "kernels": ("default", "fast"),
    "vision": ("frozen", "frozen_with_projector", "trainable"),
    "precision": ("bf16", "fp8", "mxfp8", "nvfp4"),
    "train": (),  # set field by field in conf/train.yaml, no options
}
NOT_GROUPS = ("experiment", "hydra", "tune")
"""conf/ folders that are no config group: presets over several groups, Hydra's own settings, sweep and tune specs."""


def test_no_new_groups_or_options():
    conf = Path(container.__file__).resolve().parents[3] / "conf"
    found = {groups.group_name(g): tuple(sorted(p.stem for p in (conf / groups.group_name(g)).glob("*.yaml")))
             for g in groups.GROUPS}
    assert found == FROZEN_OPTIONS, "a group or option was added or removed: update FROZEN_OPTIONS, TABLE and SWAPS"
    folders = {p.name for p in conf.iterdir() if p.is_dir()}
    assert folders == {g for g, options in FROZEN_OPTIONS.items() if options} | set(NOT_GROUPS), folders


def _flat(d: object, prefix: str = "") -> dict[str, object]:
    if isinstance(d, dict):
        return {k: v for key, val in d.items() for k, v in _flat(val, f"{prefix}.{key}" if prefix else key).items()}
    return {prefix: json.dumps(d, default=str, sort_keys=True)}


# Pairs of runs that differ in one group only: applying the second option onto the first run's container may
# change only fields that group OWNS.
SWAPS = [
    ("parallelism", ["parallelism=fsdp"], ["parallelism=3d", "parallelism.tp=2", "parallelism.ep=2"]),
    ("dispatcher", ["dispatcher=alltoall"], ["dispatcher=hybridep"]),
    ("recompute", ["recompute=none"], ["recompute=full"]),
    ("cuda_graph", ["cuda_graph=none"], ["cuda_graph=moe_router_preprocess"]),
    ("kernels", ["kernels=default"], ["kernels=fast"]),
    ("vision", ["vision=trainable"], ["vision=frozen_with_projector"]),
    ("precision", ["precision=bf16"], ["precision=fp8", "precision.scaling=blockwise", "precision.router_dtype=fp64",
                                                 "precision.precision_aware_optimizer=true"]),
    ("train", [], ["train.micro_batch_size=2", "train.iterations=7", "train.save_interval=5", "train.profile_step=3",
                   "train.on_nonfinite=skip"]),
    ("model", ["model=tiny"], ["model=qwen3_vl_30b_a3b", "model.num_layers=4"]),
    ("data", ["data=mock"], ["data=sample"]),
    ("hardware", ["hardware=h200"], ["hardware=b200"]),
]


def test_every_group_has_a_swap():
    assert sorted(g for g, _, _ in SWAPS) == sorted(groups.group_name(g) for g in groups.GROUPS)


def apply_group(module: object, run: object, cfg: object) -> None:
    """The group's part of container.build: the model group also builds the provider, the data group's apply takes
    what the data stage prepared."""
    from vlmtrain.data import prepare

    if module is groups.model:
        cfg.model = groups.model.build_provider(run, container._token_ids(str(prepare.processor_dir(run))))
        groups.model.apply(run, cfg)
    elif module is groups.data:
        prepared = prepare.prepare(run)
        groups.data.apply(run, cfg, str(prepare.processor_dir(run)), prepared.hf_source, prepared.energon_kwargs)
    else:
        module.apply(run, cfg)


@pytest.mark.parametrize(("group", "before", "after"), SWAPS, ids=[s[0] for s in SWAPS])
def test_apply_writes_only_owned_fields(compose, bridge, group, before, after):
    module = getattr(groups, group)
    cfg = container.build(compose(*before))
    snapshot = _flat(cfg.to_dict())
    apply_group(module, compose(*after), cfg)
    changed = {k for k, v in _flat(cfg.to_dict()).items() if snapshot.get(k) != v}
    assert changed, f"{group}: switching options changed nothing"
    owned = module.OWNS | getattr(module, "BUILDS", frozenset())  # model: the provider it constructs
    stray = {k for k in changed if not any(covers(o, k) for o in owned)}
    assert not stray, f"{group} wrote fields it does not own: {sorted(stray)}"


def test_unknown_bridge_override_is_rejected(compose, bridge):
    from megatron.bridge.training.utils.omegaconf_utils import OverridesError

    with pytest.raises(OverridesError, match="moe_aux_loss_coef"):
        container.build(compose("+bridge.model.moe_aux_loss_coef=0.0"))


def test_resolved_configs_round_trip_to_yaml(compose, bridge, tmp_path):
    from omegaconf import OmegaConf

    from vlmtrain.config.compose import load_run

    run = compose("experiment=3d_gb200")
    OmegaConf.save(OmegaConf.structured(run), tmp_path / "run.yaml")
    assert load_run(tmp_path / "run.yaml") == run

    cfg = container.build(run)
    target.finalize(run, cfg)
    cfg.to_yaml(str(tmp_path / "bridge.yaml"))
    loaded = bridge.ConfigContainer.from_yaml(str(tmp_path / "bridge.yaml"))
    target.finalize(run, loaded)  # derived scheduler steps are recomputed, not serialized
    assert _flat(loaded.to_dict()) == _flat(cfg.to_dict())


def test_qwen35_build_refuses_hopper_without_tilelang(monkeypatch):
    """FLA's own condition (Hopper, Triton 3.4-3.7.0, no usable TileLang) fails the model build, not step 1."""
    import fla.utils
    import torch
    from fla.backends import TileLangBackend

    from vlmtrain.config.groups import model

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fla.utils, "IS_NVIDIA_HOPPER", True)
    monkeypatch.setattr(fla.utils, "TRITON_ABOVE_3_4_0", True)
    monkeypatch.setattr(fla.utils, "TRITON_ABOVE_3_7_1", False)
    monkeypatch.setattr(TileLangBackend, "can_use", classmethod(lambda cls: False))
    with pytest.raises(RuntimeError, match="tilelang"):
        model.require_gdn_backward()
    monkeypatch.setattr(TileLangBackend, "can_use", classmethod(lambda cls: True))
    model.require_gdn_backward()
