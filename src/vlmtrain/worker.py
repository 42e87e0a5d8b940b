"""Entry of one torchrun rank: load the saved run config and train (env vars came from the launcher)."""

from __future__ import annotations

import sys

from omegaconf import OmegaConf


def main(path: str) -> None:
    from vlmtrain.schema import RunConfig

    run = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.load(path)))
    from vlmtrain import trainer

    trainer.train(run)  # type: ignore[arg-type]


if __name__ == "__main__":
    main(sys.argv[1])
