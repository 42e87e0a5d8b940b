"""Train: Bridge's own pretrain() loop on the built ConfigContainer, plus vlmtrain's step counters/callbacks."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vlmtrain.schema import RunConfig


def use_prebuilt_dataset_helpers() -> None:
    """Skip Bridge's `make` of Megatron's dataset helpers: the megatron-core wheel ships them built but no
    Makefile, so compile_helpers() would exit the process. Fails loudly if the built module is missing."""
    import megatron.bridge.training.initialize as init
    from megatron.core.datasets import helpers_cpp  # noqa: F401  (the prebuilt extension must import)

    init.compile_helpers = lambda: None


def train(run: RunConfig) -> None:
    from megatron.bridge.training.pretrain import pretrain

    from vlmtrain import build, callbacks, checks
    from vlmtrain.groups import data, kernels

    cfg = build.build(run)
    checks.before_launch(run, cfg)
    use_prebuilt_dataset_helpers()
    if paths := kernels.install(run):
        print(f"[vlmtrain] kernels: Bridge code paths replaced: {', '.join(paths)}", flush=True)
    counters = callbacks.StepCounters(run)
    pretrain(cfg, counters.wrap(data.forward_step(run)), callbacks=callbacks.for_run(run, counters))
