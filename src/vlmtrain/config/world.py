"""The world a run asks for: GPUs (and this node's), nodes, every parallel degree and the pipeline stage split,
derived in one place."""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig


@dataclass(frozen=True)
class Layout:
    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    etp: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def dp(self) -> int:
        """Data-parallel size of the dense part (Megatron: world / (TP*PP*CP))."""
        return self.world_size // (self.tp * self.pp * self.cp)

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the experts (Megatron: world / (ETP*EP*PP))."""
        return self.world_size // (self.etp * self.ep * self.pp)


def gpus_per_node(run: RunConfig) -> int:
    """Explicit `gpus_per_node`, else the hardware group's."""
    return run.gpus_per_node if run.gpus_per_node is not None else run.hardware.gpus_per_node


class NoGpuError(ValueError):
    """A run set to train on a node that has no GPU (dry_run=false where nvidia-smi finds none)."""


@dataclass(frozen=True)
class Placement:
    """The GPUs per node a run really gets, and where that comes from (for messages and the sweep table)."""

    nodes: int
    gpus_per_node: int
    where: str
    """local | Slurm | declared, dry run"""

    def __str__(self) -> str:
        return (f"{self.nodes} node{'s' * (self.nodes != 1)} x {self.gpus_per_node} "
                f"GPU{'s' * (self.gpus_per_node != 1)} ({self.where})")


def local_gpus() -> int:
    """GPUs on this node, without importing torch (env vars must precede that import)."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def is_dry_run(run: RunConfig, node_gpus: int) -> bool:
    """dry_run=true, or dry_run unset on a node without GPUs."""
    return bool(run.dry_run) or (run.dry_run is None and node_gpus == 0)


def placement(run: RunConfig, node_gpus: int, slurm_tasks_per_node: int | None = None) -> Placement:
    """Which GPUs per node the run really gets: the one rule for train.py and the -m sweeper's preflight, so a
    sweep checks each job against the world it will run on. A dry run plans for what it declares (`gpus_per_node`,
    else the hardware group's). A training run keeps an explicit `gpus_per_node`, else takes its Slurm allocation's
    tasks per node (one rank per task) or, launched locally, every GPU of the node. `node_gpus`: the GPUs of the
    node the job runs on (under Slurm, the allocation's GPUs per node)."""
    if is_dry_run(run, node_gpus):
        return Placement(run.nodes, gpus_per_node(run), "declared, dry run")
    where = "local" if slurm_tasks_per_node is None else "Slurm"
    gpn = run.gpus_per_node if run.gpus_per_node is not None else slurm_tasks_per_node or node_gpus
    if gpn == 0:
        raise NoGpuError("dry_run=false, but this node has no GPU (nvidia-smi lists none): train on a GPU node, "
                         "or drop dry_run=false to print the dry-run plan.")
    return Placement(run.nodes, gpn, where)


def auto_ep(world_size: int, pp: int, etp: int, num_experts: int) -> int:
    """EP sized to the experts: the largest degree that divides both the expert count and the ranks per stage."""
    return math.gcd(max(world_size // (pp * etp), 1), num_experts)


def layout(run: RunConfig) -> Layout:
    p = run.parallelism
    nodes, gpn = run.nodes, gpus_per_node(run)
    etp = p.etp if p.etp is not None else 1
    ep = p.ep if p.ep is not None else auto_ep(nodes * gpn, p.pp, etp, run.model.num_experts)
    return Layout(nodes=nodes, gpus_per_node=gpn, tp=p.tp, pp=p.pp, vpp=p.vpp, cp=p.cp, ep=ep, etp=etp)


def shared_stages(run: RunConfig, lay: Layout) -> tuple[int, int]:
    """(pipeline stages not sized explicitly by first/last_stage_layers, decoder layers they share)."""
    p = run.parallelism
    middle = lay.pp - (p.first_stage_layers is not None) - (p.last_stage_layers is not None)
    return middle, run.model.num_layers - (p.first_stage_layers or 0) - (p.last_stage_layers or 0)


def stage_layers(run: RunConfig, lay: Layout) -> list[range]:
    """Decoder layer indices per pipeline stage, as Megatron splits them: first/last_stage_layers size the outer
    stages, the other stages share the rest evenly (preflight's pipeline_split refuses a remainder)."""
    n, p = run.model.num_layers, run.parallelism
    if lay.pp == 1:
        return [range(n)]
    middle, rest = shared_stages(run, lay)
    sizes = [rest // middle if middle else 0] * lay.pp
    if p.first_stage_layers is not None:
        sizes[0] = p.first_stage_layers
    if p.last_stage_layers is not None:
        sizes[-1] = p.last_stage_layers
    starts = [sum(sizes[:i]) for i in range(lay.pp)]
    return [range(s, s + k) for s, k in zip(starts, sizes, strict=True)]
