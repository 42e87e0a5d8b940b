"""The world a run asks for: GPUs (and this node's), nodes, every parallel degree and the pipeline stage split,
derived in one place. A `+bridge.model.<Bridge field>` override of a degree or of an outer stage's layer count
wins over the parallelism group's value, as it does in the built ConfigContainer (build.container applies the
`+bridge.*` passthrough after the groups)."""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


BRIDGE_FIELDS = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
    "first_stage_layers": "num_layers_in_first_pipeline_stage",
    "last_stage_layers": "num_layers_in_last_pipeline_stage",
}
"""parallelism field -> the `model.*` Bridge field the parallelism group writes (its OWNS)."""


def bridge_section(run: RunConfig, section: str) -> Mapping[str, Any]:
    """The run's `+bridge.<section>.*` passthrough ({} when none)."""
    values = run.bridge.get(section) if isinstance(run.bridge, Mapping) else None
    return values if isinstance(values, Mapping) else {}


def parallel_value(run: RunConfig, name: str) -> Any:
    """parallelism.<name>, unless `+bridge.model.<its Bridge field>` overrides it (that is what Bridge gets)."""
    over = bridge_section(run, "model")
    return over[BRIDGE_FIELDS[name]] if BRIDGE_FIELDS[name] in over else getattr(run.parallelism, name)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def layout(run: RunConfig) -> Layout:
    nodes, gpn = run.nodes, gpus_per_node(run)
    tp, pp, cp = (int(parallel_value(run, k)) for k in ("tp", "pp", "cp"))
    vpp, ep, etp = (_int(parallel_value(run, k)) for k in ("vpp", "ep", "etp"))
    etp = etp if etp is not None else 1
    ep = ep if ep is not None else auto_ep(nodes * gpn, pp, etp, run.model.num_experts)
    return Layout(nodes=nodes, gpus_per_node=gpn, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp)


def outer_stage_layers(run: RunConfig) -> tuple[int | None, int | None]:
    """(decoder layers of the first, of the last pipeline stage) where set explicitly; None = even split."""
    return _int(parallel_value(run, "first_stage_layers")), _int(parallel_value(run, "last_stage_layers"))


def shared_stages(run: RunConfig, lay: Layout) -> tuple[int, int]:
    """(pipeline stages not sized explicitly by first/last_stage_layers, decoder layers they share)."""
    first, last = outer_stage_layers(run)
    middle = lay.pp - (first is not None) - (last is not None)
    return middle, run.model.num_layers - (first or 0) - (last or 0)


def stage_layers(run: RunConfig, lay: Layout) -> list[range]:
    """Decoder layer indices per pipeline stage, as Megatron splits them: first/last_stage_layers size the outer
    stages, the other stages share the rest evenly (preflight's pipeline_split refuses a remainder)."""
    n, (first, last) = run.model.num_layers, outer_stage_layers(run)
    if lay.pp == 1:
        return [range(n)]
    middle, rest = shared_stages(run, lay)
    sizes = [rest // middle if middle else 0] * lay.pp
    if first is not None:
        sizes[0] = first
    if last is not None:
        sizes[-1] = last
    starts = [sum(sizes[:i]) for i in range(lay.pp)]
    return [range(s, s + k) for s, k in zip(starts, sizes, strict=True)]
