""" "Did it actually run" checks: a requested setting that would not take effect fails the run, never a
silent fallback (e.g. a flex dispatcher whose DeepEP/HybridEP package is not installed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vlmtrain.train.unwrap import unwrap

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


class SettingNotApplied(RuntimeError):
    """A requested setting is not what runs; the message names the group and the fix."""


def before_launch(run: RunConfig, cfg: ConfigContainer) -> None:
    """Checks that need this machine's packages, before any GPU work."""
    backend = str(run.dispatcher.backend)
    if backend in ("hybridep", "deepep"):
        try:
            import deep_ep
        except ImportError as e:
            branch = "hybrid-ep branch" if backend == "hybridep" else "main"
            raise SettingNotApplied(
                f"dispatcher={backend} needs the DeepEP package ({branch}), which is not installed here ({e}). "
                "Install it or use dispatcher=alltoall."
            ) from e
        if backend == "hybridep" and not hasattr(deep_ep, "HybridEPBuffer"):
            raise SettingNotApplied(
                "dispatcher=hybridep: the installed deep_ep has no HybridEPBuffer (needs the "
                "hybrid-ep branch). Use dispatcher=alltoall or dispatcher=deepep."
            )


def tower_params(model_chunks: list[Any]) -> dict[str, dict[str, int]]:
    """Trainable and frozen parameter counts of the ViT, the projector and the decoder on this rank."""
    out = {t: {"trainable": 0, "frozen": 0} for t in ("vision", "projector", "decoder")}
    for chunk in model_chunks:
        for name, p in unwrap(chunk).named_parameters():
            if name.startswith("vision_model."):
                tower = "projector" if (".merger." in name or "deepstack_merger" in name) else "vision"
            else:
                tower = "decoder"
            out[tower]["trainable" if p.requires_grad else "frozen"] += p.numel()
    return out


def vit_attention_head_dims(model_chunks: list[Any]) -> list[int]:
    """The head dims the ViT's TE attention modules run at (kernels.vit_attention_head_dim pads them)."""
    return sorted({m.hidden_size_per_attention_head_k for c in model_chunks for name, m in unwrap(c).named_modules()
                   if name.startswith("vision_model.") and hasattr(m, "hidden_size_per_attention_head_k")})


def microbatches(run: RunConfig, res: Resolved) -> int:
    """Megatron's micro-batches per step (its calculator, set up from the built config) must be the resolved
    grad-accum that the plan, the memory estimate and the metrics assumed; returns it."""
    from megatron.core.num_microbatches_calculator import get_num_microbatches

    n = get_num_microbatches()
    if n != res.grad_accum:
        from vlmtrain.config.groups.train import global_batch_size

        t = run.train
        raise SettingNotApplied(
            f"Megatron runs {n} micro-batches per step, but the run resolved grad_accum={res.grad_accum} "
            f"(train.global_batch_size {global_batch_size(run)} / (train.micro_batch_size {t.micro_batch_size} x DP "
            f"{res.layout.dp})): a +bridge.train.* or parallelism override changed the batch arithmetic.")
    return n


def after_model_build(run: RunConfig, res: Resolved, context: Any) -> dict[str, Any]:
    """What was instantiated, after Megatron Core's defaults; raises if it contradicts the request."""
    cfg = context.state.cfg.model
    params = tower_params(context.model)
    report: dict[str, Any] = {
        "micro_batches": microbatches(run, res),
        "dispatcher_type": cfg.moe_token_dispatcher_type,
        "flex_backend": cfg.moe_flex_dispatcher_backend if cfg.moe_token_dispatcher_type == "flex" else None,
        "recompute_granularity": cfg.recompute_granularity,
        "recompute_modules": list(cfg.recompute_modules or []),
        "recompute_method": cfg.recompute_method,
        "cuda_graph_impl": cfg.cuda_graph_impl,
        "cuda_graph_modules": [getattr(m, "name", str(m)) for m in (cfg.cuda_graph_modules or [])],
        "params": params,
    }
    # Every module under the wrappers (DDP, Float16Module, Megatron-FSDP), not only the unwrapped model's.
    dispatchers = {
        type(m.token_dispatcher).__name__
        for c in context.model
        for m in c.modules()
        if getattr(m, "token_dispatcher", None) is not None
    }
    report["dispatcher_classes"] = sorted(dispatchers)
    report["vit_attention_head_dims"] = vit_attention_head_dims(context.model)
    expected = {
        "alltoall": "MoEAlltoAllTokenDispatcher",
        "hybridep": "MoEFlexTokenDispatcher",
        "deepep": "MoEFlexTokenDispatcher",
    }[str(run.dispatcher.backend)]
    if dispatchers != {expected}:  # none found is a failure too: the check must not pass vacuously
        raise SettingNotApplied(f"dispatcher={run.dispatcher.backend} requested but {sorted(dispatchers)} was built "
                                f"(expected {expected} in every MoE layer).")
    padded = run.kernels.vit_attention_head_dim
    if padded is not None and report["vit_attention_head_dims"] != [padded]:  # none found fails too
        raise SettingNotApplied(f"kernels.vit_attention_head_dim={padded} requested but the ViT's attention runs at "
                                f"{report['vit_attention_head_dims']}.")
    if run.recompute.granularity == "none" and cfg.recompute_modules:
        raise SettingNotApplied(f"recompute=none but Megatron set recompute_modules={cfg.recompute_modules}.")
    if run.model.hf_path and context.state.train_state.step == 0:  # a resume loads its own checkpoint instead
        from vlmtrain.train import hf_loaded

        report["hf_embedding_max_diff"] = diff = hf_loaded.embedding_max_diff(run.model.hf_path, context.model)
        if diff is not None and diff != 0.0:
            raise SettingNotApplied(f"model.hf_path={run.model.hf_path}: the built word embedding differs from the "
                                    f"checkpoint's (cast to the model's dtype) by up to {diff}: its weights did not "
                                    "load.")
    if run.vision.freeze_vision_model and params["vision"]["trainable"]:
        raise SettingNotApplied("vision=frozen but ViT parameters require grad.")
    if not run.vision.freeze_vision_model and params["vision"]["frozen"] and params["vision"]["trainable"] == 0:
        raise SettingNotApplied("vision=trainable but every ViT parameter is frozen.")
    return report


def frozen_checksums(model_chunks: list[Any]) -> dict[str, float]:
    """Checksum (sum + abs-sum) of every frozen tower's whole parameters. A sharded (DTensor) parameter is gathered
    first: Megatron-FSDP swaps module parameters between its sharded DTensors and unsharded buffers and leaves
    frozen ones unsharded after backward (2 x H200, FSDP EP2, vision=frozen: per-rank shard sums before training,
    the whole tower's sum on every rank after), so only whole tensors compare across training. Collective when
    sharded: every rank calls this at the same point."""
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import uneven_dtensor_to_full_tensor
    from torch.distributed.tensor import DTensor

    sums: dict[str, float] = {}
    for chunk in model_chunks:
        for name, p in unwrap(chunk).named_parameters():
            if p.requires_grad:
                continue
            # Megatron-FSDP shards unevenly; its own gather is what Bridge's HF export uses on these DTensors
            t = (uneven_dtensor_to_full_tensor(p) if isinstance(p, DTensor) else p).detach().float()
            tower = name.split(".", 1)[0]
            sums[tower] = sums.get(tower, 0.0) + (float(t.sum() + t.abs().sum()) if t.numel() else 0.0)
    return sums


def graphed_layers(model_chunks: list[Any]) -> int:
    """Layers that hold captured TE CUDA graphs (Megatron's TECudaGraphHelper sets `layer.cuda_graphs`)."""
    return sum(1 for c in model_chunks for m in unwrap(c).modules() if getattr(m, "cuda_graphs", None))


def after_training(run: RunConfig, context: Any, frozen_before: dict[str, float], max_graphed: int) -> dict[str, Any]:
    """Frozen towers did not move; requested CUDA graphs were captured (Bridge deletes them before the end of
    training, so `max_graphed` is the most graphed layers seen at any step end)."""
    frozen_after = frozen_checksums(context.model)
    report = {
        "frozen_unchanged": frozen_after == frozen_before,
        "frozen_towers": sorted(frozen_before),
        "graphed_layers": max_graphed,
    }
    if not report["frozen_unchanged"]:
        raise SettingNotApplied(f"frozen parameters changed during training: {frozen_before} -> {frozen_after}")
    steps = context.state.train_state.step
    if run.cuda_graph.modules and steps > run.cuda_graph.warmup_steps + 1 and max_graphed == 0:
        raise SettingNotApplied(
            f"cuda_graph={run.choices.get('cuda_graph', run.cuda_graph.modules)} requested but no "
            "layer holds a captured CUDA graph."
        )
    return report
