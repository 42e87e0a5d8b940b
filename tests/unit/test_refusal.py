"""train.py's training path (dry_run=false) refuses bad input as the dry run does: one message naming the fix and
status 2, before any rank starts, never Hydra's traceback with status 1. Preflight runs before any GPU work, so on
this GPU-less machine `dry_run=false gpus_per_node=1` reaches the same refusal a GPU node gets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
