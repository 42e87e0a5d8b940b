"""Bad command-line input names the valid choices (issue: clear errors on bad input)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vlmtrain.config.overrides import check_args, unknown_key

ROOT = Path(__file__).resolve().parents[2]


def test_typo_in_nested_key_names_valid_keys_and_closest():
    msg = unknown_key("train.micro_batch")
    assert "micro_batch_size" in msg and "global_batch_size" in msg
    assert "Did you mean train.micro_batch_size?" in msg


def test_valid_keys_pass():
    assert (
        check_args(
            [
                "train.micro_batch_size=2",
                "model.vit.depth=2",
                "parallelism=3d",
                "+bridge.model.x=1",
                "hardware.env.FOO=1",
                "data.payload.seed=3",
                "hydra.run.dir=x",
            ]
        )
        is None
    )


def test_top_level_typo():
    assert "Did you mean dry_run?" in check_args(["dryrun=true"])


def test_unknown_group_option_lists_available_options():
    """Hydra itself answers an unknown group option with the available ones; train.py keeps that."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "parallelism=fsd"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode != 0
    assert "Available options in 'parallelism'" in out.stderr and "fsdp" in out.stderr and "3d" in out.stderr


def test_train_py_names_the_valid_keys_for_a_typo():
    """`python train.py train.micro_batch=2` (and its -m form) exits 2 naming the closest key, before Hydra (as
    `vlmtrain data check` does)."""
    for args in (["train.micro_batch=2"], ["-m", "train.micro_batch=1,2"]):
        out = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 2, out.stderr
        assert "Did you mean train.micro_batch_size?" in out.stderr and "global_batch_size" in out.stderr
        assert "not in 'TrainConfig'" not in out.stderr
