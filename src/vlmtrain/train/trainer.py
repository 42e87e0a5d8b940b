"""Train: Bridge's own pretrain() loop on the built ConfigContainer, counting every micro-batch, with the callbacks
it is given (worker.py passes observe's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.train.step_counters import StepCounters


def use_prebuilt_dataset_helpers() -> None:
    """Skip Bridge's `make` of Megatron's dataset helpers: the megatron-core wheel ships them built but no
    Makefile, so compile_helpers() would exit the process. Fails loudly if the built module is missing."""
    import megatron.bridge.training.initialize as init
    from megatron.core.datasets import helpers_cpp  # noqa: F401  (the prebuilt extension must import)

    init.compile_helpers = lambda: None


def build(run: RunConfig, res: Resolved) -> tuple[ConfigContainer, list[str]]:
    """The run's container as pretrain() gets it: built, checked against this machine, with Bridge's code paths
    replaced (the redaction and sample ids always; the kernels' per run, returned). Also for GPU checks that drive
    Bridge's setup() themselves (lab.checks.packing_equivalence)."""
    from vlmtrain.build import container
    from vlmtrain.train import after_build, bridge_patches

    cfg = container.build(run, res)
    after_build.before_launch(run, cfg)
    use_prebuilt_dataset_helpers()
    bridge_patches.install_always()  # redaction before Bridge logs or saves the container; sample ids; no Step Time
    return cfg, bridge_patches.install(run)


def train(run: RunConfig, res: Resolved, counters: StepCounters, callbacks: list[Any]) -> None:
    """pretrain() on the run's container; `counters` sees every micro-batch, Bridge runs `callbacks`."""
    from megatron.bridge.training.pretrain import pretrain

    from vlmtrain.config.groups import data

    cfg, paths = build(run, res)
    if paths:
        print(f"[vlmtrain] kernels: Bridge code paths replaced: {', '.join(paths)}", flush=True)
    pretrain(cfg, counters.wrap(data.forward_step(run)), callbacks=callbacks)
