"""The flow of one run: compose -> check -> build -> launch -> train. train.py calls `main`."""

from __future__ import annotations

import shutil
import subprocess
import sys

from omegaconf import DictConfig

from vlmtrain import launch, plan, preflight
from vlmtrain.compose import to_run


def local_gpus() -> int:
    """GPUs on this node, without importing torch (env vars must precede that import)."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def main(cfg: DictConfig) -> int:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    run = to_run(cfg, dict(hc.runtime.choices), hc.runtime.output_dir)
    gpus = local_gpus()
    if run.dry_run or (run.dry_run is None and gpus == 0):
        if run.dry_run is None:
            print("[vlmtrain] no GPU on this machine: printing the dry-run plan (dry_run=false forces training).")
        return plan.dry_run(run)
    if run.gpus_per_node is None and not launch.under_slurm():
        run.gpus_per_node = gpus
    for finding in preflight.enforce(run):
        print(f"[vlmtrain] {finding}", file=sys.stderr)
    if launch.under_slurm():
        launch.in_process(run)
        return 0
    return launch.local(run)
