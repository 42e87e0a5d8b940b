"""Check: cross-group rules that stop bad combinations before they reach a cluster.

Bridge validates only when ranks start, lets some settings fall back silently and accepts layouts that fail
later (FSDP with PP, VPP not dividing the layers). Each rule encodes a known incompatibility or pitfall
of these stacks, or a Bridge/Megatron assert that would otherwise fire on the cluster. Rules never mutate; each
message names the groups involved and the override that fixes it.

`registry` holds the findings, the rule decorator and the checks; one module per concern registers its rules
into it, and importing this package imports them all, in this order (the order findings are listed in).
"""

from __future__ import annotations

# isort: off
# each module registers its rules on import; this order is the order of the findings
from vlmtrain.check.preflight import hf_checkpoint  # noqa: F401
from vlmtrain.check.preflight import dispatcher  # noqa: F401
from vlmtrain.check.preflight import kernels  # noqa: F401
from vlmtrain.check.preflight import parallelism  # noqa: F401
from vlmtrain.check.preflight import recompute_graphs  # noqa: F401
from vlmtrain.check.preflight import packing  # noqa: F401
from vlmtrain.check.preflight import data  # noqa: F401
from vlmtrain.check.preflight import validation  # noqa: F401
from vlmtrain.check.preflight import precision  # noqa: F401
from vlmtrain.check.preflight import memory  # noqa: F401
from vlmtrain.check.preflight import defaults  # noqa: F401
# isort: on
from vlmtrain.check.preflight.recompute_graphs import deepstack_blocks_full_recompute
from vlmtrain.check.preflight.registry import (
    RULES,
    Finding,
    PreflightError,
    Rule,
    Severity,
    check,
    enforce,
    errors,
    rule,
)

__all__ = ["RULES", "Finding", "PreflightError", "Rule", "Severity", "check", "deepstack_blocks_full_recompute",
           "enforce", "errors", "rule"]
