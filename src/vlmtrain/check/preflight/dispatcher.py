"""Preflight rules: dispatcher x hardware (HybridEP topology, DeepEP support)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlmtrain.check.preflight.registry import Severity, bridge, rule
from vlmtrain.config.groups.dispatcher import Backend

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


@rule(Severity.error)
def hybridep_topology(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
    if run.dispatcher.backend != Backend.hybridep:
        return None
    hw = run.hardware
    if hw.sm_major not in (8, 9, 10):
        return (f"dispatcher=hybridep needs SM 8.x/9.x/10.x; hardware={hw.name} is SM {hw.sm_major}. "
                "Use dispatcher=alltoall.")
    forced = bridge(run, "model", "moe_token_dispatcher_type")
    if forced not in (None, "flex"):
        return (f"dispatcher=hybridep needs the flex dispatcher; +bridge.model.moe_token_dispatcher_type={forced} "
                "overrides it.")
    if hw.mnnvl and lay.ep > hw.nvlink_domain_size:
        return (f"dispatcher=hybridep on hardware={hw.name}: EP={lay.ep} exceeds the {hw.nvlink_domain_size}-GPU "
                f"NVLink domain. Use parallelism.ep<={hw.nvlink_domain_size}.")
    return None


@rule(Severity.warning)
def hybridep_crosses_nodes(run: RunConfig, res: Resolved) -> str | None:
    lay = res.layout
    hw = run.hardware
    if run.dispatcher.backend == Backend.hybridep and not hw.mnnvl and lay.ep > hw.nvlink_domain_size:
        return (f"dispatcher=hybridep on hardware={hw.name}: EP={lay.ep} spans {lay.ep // hw.nvlink_domain_size} "
                f"NVLink domains of {hw.nvlink_domain_size}; tokens cross nodes over the network.")
    return None


@rule(Severity.error)
def deepep_not_on_gb200(run: RunConfig, res: Resolved) -> str | None:
    hw = run.hardware
    if run.dispatcher.backend == Backend.deepep and hw.sm_major == 10 and not hw.device_name.startswith(
        ("NVIDIA B200", "NVIDIA B300")
    ):
        return f"dispatcher=deepep is not supported on hardware={hw.name} (Bridge rejects it). Use dispatcher=hybridep."
    if run.dispatcher.backend == Backend.deepep and hw.sm_major not in (8, 9, 10):
        return f"dispatcher=deepep needs SM 8.x/9.x or B200; hardware={hw.name}. Use dispatcher=alltoall."
    return None
