"""Launch on this node (`python train.py ...` on a GPU node): save the resolved run config and re-execute through
torchrun (`python -m torch.distributed.run --nproc-per-node N -m vlmtrain.worker <run_config.yaml>`), one rank per
GPU, with the hardware group's env vars in place before torch is imported.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from vlmtrain.config import redact, resolve, world

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

RUN_CONFIG = "run_config.yaml"
RANKS_LOG = "ranks.log"


def save_run_config(run: RunConfig, res: Resolved) -> Path:
    """The config the ranks load, and next to it run.json, its resolved values (config.resolve). Secrets are
    written as `${oc.env:...}` references that the ranks resolve from the environment they inherit
    (vlmtrain.config.redact.ENV_REFERENCES), so the file never holds one."""
    out = Path(run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RUN_CONFIG
    tree = OmegaConf.to_container(OmegaConf.structured(run), enum_to_str=True)
    OmegaConf.save(OmegaConf.create(redact.redact(tree, masking=redact.ENV_REFERENCES)), path)
    resolve.save(res, out)
    return path


def loaded(path: str | Path) -> tuple[RunConfig, Resolved]:
    """What every rank entry starts from: the run config saved at `path` and the run.json saved next to it
    (`save_run_config`; a missing one is named, not read as defaults)."""
    from vlmtrain.config.compose import load_run

    res = resolve.load(Path(path).parent)
    if res is None:
        raise FileNotFoundError(f"{Path(path).parent / resolve.RUN_JSON}: the launcher saves it next to {path}")
    return load_run(path), res


def rank_env(res: Resolved) -> dict[str, str]:
    """The resolved env vars the ranks get before torch is imported, each unless this environment sets it already
    (as Bridge's own env_vars never override one)."""
    return {k: v for k, v in res.env_vars.items() if k not in os.environ}


def unlaunchable(lay: world.Layout, node_gpus: int) -> str | None:
    """Why torchrun cannot start this world on this node (`node_gpus`: the GPUs nvidia-smi lists), before it tries:
    ranks on GPUs the node lacks die in CUDA's tracebacks, and more nodes wait for ranks no one starts."""
    if lay.nodes > 1:
        return (f"nodes={lay.nodes}: a local launch starts the ranks of this node only; run on Slurm "
                "(hydra/launcher=slurm, with -m) or set nodes=1.")
    if lay.gpus_per_node <= node_gpus:
        return None
    if not node_gpus:
        return (f"gpus_per_node={lay.gpus_per_node}, but this node has no GPU (nvidia-smi lists none): train on a GPU "
                "node, or set dry_run=true to print the dry-run plan.")
    return (f"gpus_per_node={lay.gpus_per_node}, but this node has {node_gpus} GPU(s): train on a node with that "
            f"many, or set gpus_per_node={node_gpus} (unset: every local GPU).")


def launch(run: RunConfig, res: Resolved, module: str = "vlmtrain.worker", log: str = RANKS_LOG,
           args: tuple[str, ...] = ()) -> int:
    """Start one rank per local GPU through torchrun, with the resolved env vars, and wait for them. `module` is
    what each rank runs on the saved run config, `args` after its path (a GPU check or `vlmtrain export` may run
    its own instead of vlmtrain.worker)."""
    path = save_run_config(run, res)
    lay = res.layout
    env = {**os.environ, **rank_env(res)}
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = torchrun(module, [str(path), *args], lay.gpus_per_node, lay.nodes, master_port(env))
    print(f"[vlmtrain] launching {lay.world_size} rank(s): {' '.join(cmd)}", flush=True)
    return tee(cmd, env, Path(run.output_dir) / log)


def torchrun(module: str, args: Sequence[str], nproc: int, nnodes: int, port: str | int) -> list[str]:
    """`python -m torch.distributed.run ... -m <module> <args>`: the one way ranks start on a node, for training
    (vlmtrain.worker) and for the lab's own rank modules alike, so they all see the same launcher."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}",
            "--master-port", str(port), "-m", module, *args]


def master_port(env: dict[str, str]) -> str:
    """MASTER_PORT where set, else a port free now: two runs side by side on one node (one GPU each) collided on a
    fixed port (EADDRINUSE at the rendezvous)."""
    if env.get("MASTER_PORT"):
        return env["MASTER_PORT"]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return str(s.getsockname()[1])


def tee(cmd: list[str], env: dict[str, str], log: Path) -> int:
    """Run cmd with its output on this console and in the run dir (the sweep report reads crashes from it)."""
    with log.open("ab") as f, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as p:
        assert p.stdout is not None
        for line in p.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
            f.write(line)
        return p.wait()
