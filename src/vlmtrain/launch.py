"""Launch: one process per GPU, with the hardware group's env vars in place before torch is imported.

- Local (`python train.py ...` on a GPU node): this process saves the resolved run config and re-executes
  itself through torchrun (`python -m torch.distributed.run --nproc-per-node N -m vlmtrain.worker ...`).
- Slurm (hydra-submitit-launcher): submitit starts one task per GPU; each maps Slurm's variables to
  RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and trains in-process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from vlmtrain import world
from vlmtrain.groups import hardware

if TYPE_CHECKING:
    from vlmtrain.schema import RunConfig

RUN_CONFIG = "run_config.yaml"


def under_slurm() -> bool:
    return "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ


def slurm_rank_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """torch.distributed's variables from Slurm's (srun tasks, one per GPU)."""
    nodelist = environ.get("SLURM_JOB_NODELIST", "localhost")
    master = environ.get("MASTER_ADDR") or _first_host(nodelist)
    port = environ.get("MASTER_PORT") or str(20000 + int(environ.get("SLURM_JOB_ID", "0")) % 20000)
    return {
        "RANK": environ["SLURM_PROCID"],
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "WORLD_SIZE": environ["SLURM_NTASKS"],
        "LOCAL_WORLD_SIZE": environ.get("SLURM_NTASKS_PER_NODE", environ["SLURM_NTASKS"]).split("(")[0],
        "MASTER_ADDR": master,
        "MASTER_PORT": port,
    }


def _first_host(nodelist: str) -> str:
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        return out.stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return nodelist.split(",")[0].split("[")[0]


def export_env(run: RunConfig) -> dict[str, str]:
    """Put the run's env vars into this process's environment (explicit user settings win) and return them."""
    env = hardware.runtime_env(run)
    for k, v in env.items():
        os.environ.setdefault(k, v)
    return env


def save_run_config(run: RunConfig) -> Path:
    out = Path(run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RUN_CONFIG
    OmegaConf.save(OmegaConf.structured(run), path)
    return path


def local(run: RunConfig) -> int:
    """Start one rank per local GPU through torchrun and wait for them."""
    path = save_run_config(run)
    lay = world.layout(run)
    env = dict(os.environ)
    env.update({k: v for k, v in hardware.runtime_env(run).items() if k not in os.environ})
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={lay.gpus_per_node}",
           f"--nnodes={lay.nodes}", "--master-port", env.get("MASTER_PORT", "29511"),
           "-m", "vlmtrain.worker", str(path)]
    print(f"[vlmtrain] launching {lay.world_size} rank(s): {' '.join(cmd)}", flush=True)
    return subprocess.call(cmd, env=env)


def in_process(run: RunConfig) -> None:
    """Train in this process (a Slurm task): rank variables from Slurm, env before torch."""
    os.environ.update(slurm_rank_env())
    export_env(run)
    from vlmtrain import trainer

    trainer.train(run)
