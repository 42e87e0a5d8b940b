"""One torchrun rank of the "Bridge alone" side of overhead.py (run as vlmtrain.lab.bridge_alone): Bridge's
pretrain() on the ConfigContainer vlmtrain builds from a saved run_config.yaml, with the Bridge forward step
vlmtrain picks for the data (vlmtrain.config.groups.data.forward_step) and NO vlmtrain callbacks or counters, so the
step-time difference to `python train.py` is vlmtrain's overhead.

    python -m torch.distributed.run --nproc-per-node=2 --nnodes=1 --master-port 29500 \\
        vlmtrain.lab.bridge_alone <run dir>/run_config.yaml
    python -m vlmtrain.lab.bridge_alone <run_config.yaml> --dry-run   # CPU: build + Bridge validation only
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


def build_cfg(run: RunConfig, res: Resolved) -> ConfigContainer:
    """The same ConfigContainer vlmtrain.train.trainer.train() hands to pretrain() (build, then the helper patch), and
    the same model code: the kernels group's fast paths are part of what trains, not of vlmtrain's overhead."""
    from vlmtrain.build import container
    from vlmtrain.train import bridge_patches, trainer

    cfg = container.build(run, res)
    trainer.use_prebuilt_dataset_helpers()
    bridge_patches.install(run)
    return cfg


def main(argv: list[str]) -> int:
    from vlmtrain.launch import local

    run, res = local.loaded(argv[0])  # the run config and run.json exactly as vlmtrain.worker loads them on every rank
    cfg = build_cfg(run, res)
    if "--dry-run" in argv[1:]:
        from vlmtrain.build import target

        target.finalize(run, res, cfg)  # Bridge's runtime_config_update for the declared target, as the plan does
        print(f"[direct] {argv[0]}: ConfigContainer built and validated by Bridge", flush=True)
        return 0
    from megatron.bridge.training.pretrain import pretrain

    from vlmtrain.config.groups import data

    pretrain(cfg, data.forward_step(run))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
