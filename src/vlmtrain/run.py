"""The flow of one run: compose -> check -> build -> launch -> train. train.py calls `main`."""

from __future__ import annotations

import shutil
import subprocess
import sys

from omegaconf import DictConfig

from vlmtrain import launch, plan, preflight, wandb_log, world
from vlmtrain.compose import to_run
from vlmtrain.data.scan import BadSample
from vlmtrain.groups import data


class RunFailed(RuntimeError):
    """A job of a -m sweep ended with a non-zero status."""

    def __init__(self, status: int):
        super().__init__(status)  # args = (status,): survives pickling (submitit results)
        self.status = status

    def __str__(self) -> str:
        return f"run ended with status {self.status}"


def exit_failed(status: int) -> None:
    """Single run: exit with the status. In a -m sweep, raise instead: Hydra's run_job records an exception as
    that job's failure and the launcher goes on with the other jobs (SystemExit would end the whole sweep, and
    under submitit leave no result behind)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise RunFailed(status)
    sys.exit(status)


def local_gpus() -> int:
    """GPUs on this node, without importing torch (env vars must precede that import)."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def main(cfg: DictConfig) -> int:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    run = to_run(cfg, dict(hc.runtime.choices), hc.runtime.output_dir)
    if run.train.checkpoint_dir is None:
        # Single run: same command -> same checkpoints, so a relaunch resumes. Sweep job: its own run dir (a
        # requeued job keeps it; override_dirname holds only the swept values and would collide across sweeps).
        run.train.checkpoint_dir = (f"{run.output_dir}/checkpoints" if hc.mode == RunMode.MULTIRUN
                                    else f"checkpoints/{hc.job.override_dirname or 'default'}")
    if hc.mode == RunMode.MULTIRUN and run.wandb.group is None:
        run.wandb.group = wandb_log.sweep_group(hc.sweep.dir)
    gpus = local_gpus()
    if world.is_dry_run(run, gpus):
        if run.dry_run is None:
            print("[vlmtrain] no GPU on this machine: printing the dry-run plan (dry_run=false forces training).")
        return launch.in_process(run, dry_run=True) if launch.under_slurm() else plan.dry_run(run)
    tasks = int(launch.slurm_rank_env()["LOCAL_WORLD_SIZE"]) if launch.under_slurm() else None
    run.gpus_per_node = world.placement(run, gpus, slurm_tasks_per_node=tasks).gpus_per_node
    for finding in preflight.enforce(run):
        print(f"[vlmtrain] {finding}", file=sys.stderr)
    if launch.under_slurm():
        return launch.in_process(run)
    try:
        data.prepare(run)  # scan the data once, here, before torchrun starts the ranks
    except BadSample as e:
        print(f"[vlmtrain] {e}", file=sys.stderr)
        return 2
    return launch.local(run)
