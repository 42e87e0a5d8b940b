"""hardware group: what a GPU kind is (per-node size, NVLink domain, peaks, memory, links) and its env vars.

| option | GPUs/node | NVLink domain | BF16 / FP8 / FP4 peak (TFLOP/s) | HBM / NVLink / NIC (GB/s) | dispatcher |
|--------|-----------|---------------|---------------------------------|---------------------------|------------|
| gb200  | 4         | 72 (MNNVL)    | 2500 / 5000 / 10000             | 8000 / 900 / 50           | hybridep   |
| b200   | 8         | 8             | 2250 / 4500 / 9000              | 8000 / 900 / 50           | alltoall   |
| h100   | 8         | 8             | 989 / 1979 / -                  | 3350 / 450 / 50           | alltoall   |
| h200   | 8         | 8             | 989 / 1979 / -                  | 4800 / 450 / 50           | alltoall   |

Peaks, HBM and link bandwidths are the vendor's datasheet figures (per GPU, one direction: NVLink 4 is 900 GB/s and
NVLink 5 1.8 TB/s both directions together; scale-out is one 400 Gb/s ConnectX-7 NIC per GPU as in DGX/HGX
systems): the step-time model (check.speed) divides by them and its calibration says how much of them is reached.

The env vars must be in the environment before Python imports torch (Bridge's `env_vars` are applied late
with setdefault), so the launcher exports the resolved env (config.resolve keeps it per group, `Resolved.env_vars`
merges it); `apply()` also records them in `cfg.env_vars`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

OWNS = frozenset({"env_vars"})


@dataclass
class HardwareConfig:
    name: str = "h200"
    """Short name used in tags and the plan."""
    device_name: str = "NVIDIA H200"
    """What torch.cuda.get_device_name() reports on this kind; the dry run presents it to Bridge."""
    sm_major: int = 9
    """Compute capability major; Bridge's flex-dispatcher checks read it."""
    sm_minor: int = 0
    gpus_per_node: int = 8
    nvlink_domain_size: int = 8
    """GPUs that share one NVLink domain (72 on GB200 NVL72 racks)."""
    mnnvl: bool = False
    """Multi-node NVLink (GB200): HybridEP spans nodes inside the domain."""
    peak_bf16_tflops: float = 989.0
    """Vendor dense BF16 peak per GPU (never the 2x sparsity figure); the MFU denominator of every precision."""
    peak_fp8_tflops: float | None = None
    """Vendor dense FP8 peak per GPU (FP8 and MXFP8); null where the GPU has no FP8 tensor cores."""
    peak_fp4_tflops: float | None = None
    """Vendor dense FP4 peak per GPU (NVFP4); null where the GPU has no FP4 tensor cores."""
    memory_gib: float = 141.0
    """HBM per GPU: the budget of the memory estimate."""
    hbm_gb_per_s: float = 4800.0
    """Vendor HBM bandwidth per GPU: the rate of the optimizer's memory-bound update (check.speed)."""
    nvlink_gb_per_s: float = 450.0
    """Vendor NVLink bandwidth per GPU in one direction: collectives among the GPUs of one NVLink domain."""
    scaleout_gb_per_s: float = 50.0
    """Network bandwidth per GPU in one direction (one 400 Gb/s NIC per GPU): collectives that leave the domain."""
    default_dispatcher: str = "alltoall"
    """Dispatcher used by `dispatcher=auto`."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for every rank, exported before torch is imported."""


def hybridep_env(hw: HardwareConfig, ep: int) -> dict[str, str]:
    """HybridEP topology variables from the NVLink domain and EP (the rule of Bridge's perf harness)."""
    ranks = ep if hw.mnnvl else min(ep, hw.nvlink_domain_size)
    return {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": str(ranks),
        "NVLINK_DOMAIN_SIZE": str(hw.nvlink_domain_size),
        "USE_MNNVL": "1" if hw.mnnvl else "0",
    }


def apply(run: RunConfig, res: Resolved, cfg: ConfigContainer) -> None:
    cfg.env_vars = res.env_vars
