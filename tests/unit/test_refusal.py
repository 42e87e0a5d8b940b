"""train.py's training path (dry_run=false) refuses bad input as the dry run does: one message naming the fix and
status 2, before any rank starts, never Hydra's traceback with status 1. Preflight runs before any GPU work, so on
this GPU-less machine `dry_run=false gpus_per_node=1` reaches the same refusal a GPU node gets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "train.py", *overrides, f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_preflight_refusal_exits_2_with_one_message(tmp_path: Path) -> None:
    moved = tmp_path / "moved-checkpoint"
    out = train(tmp_path, "dry_run=false", "gpus_per_node=1", f"model.hf_path={moved}")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "HYDRA_FULL_ERROR" not in out.stderr
    said = f"[error] hf_path_matches_model: model.hf_path={moved} has no config.json"
    assert (out.stdout + out.stderr).count(said) == 1
    assert "preflight refused the run before any GPU work" in out.stderr
    assert not (tmp_path / "run" / "ranks.log").exists()  # no torchrun


def test_training_without_a_gpu_exits_2_naming_the_fix(tmp_path: Path) -> None:
    out = train(tmp_path, "dry_run=false")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert "dry_run=false, but this node has no GPU (nvidia-smi lists none)" in out.stderr
    assert "drop dry_run=false to print the dry-run plan" in out.stderr


def test_a_gpu_count_this_node_lacks_is_refused_before_torchrun(tmp_path: Path) -> None:
    """gpus_per_node=1 dry_run=false here (no GPU): preflight and the data scan pass, then one message, status 2 and
    the refusal recorded in the run dir, where torchrun's ranks used to die in CUDA's tracebacks."""
    out = train(tmp_path, "dry_run=false", "gpus_per_node=1")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "torch.distributed.run" not in out.stdout
    assert "gpus_per_node=1, but this node has no GPU (nvidia-smi lists none)" in out.stderr
    assert not (tmp_path / "run" / "ranks.log").exists()
    assert "this node has no GPU" in json.loads((tmp_path / "run" / "failure-refused.json").read_text())["error"]


@pytest.mark.parametrize(("overrides", "said"), [
    (["data.packing=yes"], "data.packing='yes': use false, auto or a positive number of tokens"),
    (["train.micro_batch=2"], "Unknown key 'train.micro_batch'"),  # before Hydra composes: the valid keys named
])
def test_bad_values_and_keys_exit_2_with_one_message(tmp_path: Path, overrides: list[str], said: str) -> None:
    out = train(tmp_path, *overrides, "dry_run=true")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count(said) == 1


def test_train_help_lists_only_the_runs_groups() -> None:
    """conf/tune/ holds the lab's specs, no group train.py composes: --help does not offer it."""
    out = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    groups = out.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    assert out.returncode == 0 and "recompute: auto, full, none, selective" in groups
    assert "\ntune:" not in groups and "experiment: " in groups
