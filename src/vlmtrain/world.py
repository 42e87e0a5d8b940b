"""The world layout a run asks for: GPUs, nodes and every parallel degree, derived in one place."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vlmtrain.schema import RunConfig


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


def auto_ep(world_size: int, pp: int, etp: int, num_experts: int) -> int:
    """EP sized to the experts: the largest degree that divides both the expert count and the ranks per stage."""
    return math.gcd(max(world_size // (pp * etp), 1), num_experts)


def layout(run: RunConfig) -> Layout:
    p = run.parallelism
    nodes, gpn = run.nodes, gpus_per_node(run)
    etp = p.etp if p.etp is not None else 1
    ep = p.ep if p.ep is not None else auto_ep(nodes * gpn, p.pp, etp, run.model.num_experts)
    return Layout(nodes=nodes, gpus_per_node=gpn, tp=p.tp, pp=p.pp, vpp=p.vpp, cp=p.cp, ep=ep, etp=etp)
