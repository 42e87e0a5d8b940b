"""The flow of one run: compose -> resolve -> check -> build -> launch -> train. train.py calls `main`."""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from vlmtrain import worker
from vlmtrain.build import plan
from vlmtrain.check import bridge_fields, preflight, refusal, speed
from vlmtrain.check.defaults import placed
from vlmtrain.config import world
from vlmtrain.config.compose import to_run
from vlmtrain.data import prepare
from vlmtrain.data.scan import BadSample
from vlmtrain.launch import local, slurm
from vlmtrain.observe import failure, startup, wandb_run


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


def refused(findings: list[preflight.Finding]) -> bool:
    """Print preflight's findings as the dry-run plan lists them; True when an error refuses the run (its status
    2 then goes through exit_failed: a clean message, no traceback, and in a -m sweep that job's failure)."""
    for finding in findings:
        print(f"[vlmtrain] {finding}", file=sys.stderr)
    if not preflight.errors(findings):
        return False
    print("[vlmtrain] preflight refused the run before any GPU work; dry_run=true prints its whole plan.",
          file=sys.stderr)
    return True


def main(cfg: DictConfig) -> int:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    launched = startup.mark_launch()
    hc = HydraConfig.get()
    try:
        run = to_run(cfg, hc, hc.runtime.output_dir)
    except ValueError as e:  # a value the schema refuses (data.packing=yes): its message names the fix
        return refusal.refuse(hc.runtime.output_dir, str(e))
    if hc.mode == RunMode.MULTIRUN and run.wandb.group is None:
        run.wandb.group = wandb_run.sweep_group(hc.sweep.dir)
    gpus = world.local_gpus()
    tasks = int(slurm.slurm_rank_env()["LOCAL_WORLD_SIZE"]) if slurm.under_slurm() else None
    try:
        _, res = placed(run, gpus, slurm_tasks_per_node=tasks)  # later stages read layout and settled defaults here
    except world.NoGpuError as e:
        return refusal.refuse(run.output_dir, str(e))
    if world.is_dry_run(run, gpus):
        if run.dry_run is None:
            print("[vlmtrain] no GPU on this machine: printing the dry-run plan (dry_run=false forces training).")
        return slurm.in_process(run, res, None) if slurm.under_slurm() else plan.dry_run(run, res)
    # +bridge.* fields are checked against Bridge's classes, which import torch: not in a Slurm task before its env
    findings = preflight.check(run, res) + ([] if slurm.under_slurm() else bridge_fields.findings(run))
    if refused(findings):
        return refusal.refuse(run.output_dir, "; ".join(str(f) for f in preflight.errors(findings)), printed=True)
    if not slurm.under_slurm() or slurm.slurm_rank_env()["RANK"] == "0":  # one writer per run dir
        speed.save(speed.predicted(run, res), run.output_dir)  # what the report puts beside the measured step
    if slurm.under_slurm():
        return slurm.in_process(run, res, worker.train)
    try:
        prepare.prepare(run, res)  # scan the data once, here, before torchrun starts the ranks
    except BadSample as e:
        return refusal.refuse(run.output_dir, str(e))
    if problem := local.unlaunchable(res.layout, gpus):
        return refusal.refuse(run.output_dir, problem)
    return failure.exit_status(local.launch(run, res), run.output_dir, since=launched)
