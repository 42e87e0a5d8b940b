"""vlmtrain entry point: `python train.py [group=option ...] [key=value ...]` (see README.md)."""

import sys

import hydra
from omegaconf import DictConfig

from vlmtrain.config.schema import register

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from vlmtrain.flow import main as run_main

    status = run_main(cfg)
    if status:
        from vlmtrain.flow import exit_failed

        exit_failed(status)


if __name__ == "__main__":
    from vlmtrain.config.overrides import check_args

    # A typo'd key would get Hydra's bare "Key 'x' not in 'TrainConfig'" and a hint to add `+`: name the valid keys.
    if problem := check_args(sys.argv[1:]):
        print(f"[vlmtrain] {problem}", file=sys.stderr)
        sys.exit(2)
    main()
