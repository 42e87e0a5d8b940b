"""What the packing equivalence check accepts (vlmtrain.lab.checks.packing_equivalence): the tolerances of the
packed-vs-alone comparison, fixed before the first GPU run, and the negative controls that must miss them.
"""

from __future__ import annotations

from typing import Any

CE_MEAN_TOL_NATS = 0.01
"""Largest accepted mean |CE packed - CE alone| over the loss tokens, fixed before the first GPU run: bf16 GEMMs of
different shapes (one row of all samples vs one sample) round differently in every layer."""
CE_P99_TOL_NATS = 0.05
"""Largest accepted 99th percentile of the per-token |CE| difference."""
GRAD_COSINE_MIN = 0.99
"""Smallest accepted cosine between the packed gradient and the sum of the alone ones."""
CONTROL_MARGIN = 10
"""A control must differ by at least this many times CE_MEAN_TOL_NATS, or the check could not have failed."""
CONTROLS = ("positions", "boundaries")
GDN_CONTROLS = ("gdn_boundaries",)
"""Models with Gated DeltaNet layers (Qwen3.5) also: those layers run the row as one sequence
(vlmtrain.lab.checks.packing_gdn_control), the attention layers and the positions keep each sample's."""
CHECKS = ("whole_row_positions",)
"""Recorded beside the controls, expected to change nothing (packing_equivalence's docstring says why)."""


def passes(m: dict[str, Any]) -> dict[str, bool]:
    """The packed-vs-alone comparison of one model state against the tolerances."""
    ok = {f"{k}_ok": m[k] <= CE_MEAN_TOL_NATS for k in m if k.startswith("ce_mean_abs_diff_nats")}
    ok |= {f"{k}_ok": m[k] <= CE_P99_TOL_NATS for k in m if k.startswith("ce_p99_abs_diff_nats")}
    ok |= {f"{k}_ok": m[k] >= GRAD_COSINE_MIN for k in m if k.startswith("grad_cosine")}
    return ok


def strong(m: dict[str, Any], kind: str) -> bool:
    """The control misses the tolerance by CONTROL_MARGIN at a state where the comparison passes."""
    return m[f"control_ce_mean_abs_diff_nats_{kind}"] >= CONTROL_MARGIN * CE_MEAN_TOL_NATS and all(passes(m).values())


def measured_controls(m: dict[str, Any]) -> list[str]:
    """The controls a state's metrics hold (GDN_CONTROLS only on models with Gated DeltaNet layers)."""
    return [k for k in (*CONTROLS, *GDN_CONTROLS) if f"control_ce_mean_abs_diff_nats_{k}" in m]


def verdict(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Every state's comparison passes; each control was strong at some state (and at which trained step)."""
    out: dict[str, Any] = {"comparison_ok": all(all(passes(m).values()) for m in history)}
    for kind in measured_controls(history[0]):
        at = [m["trained_steps"] for m in history if strong(m, kind)]
        out[f"control_{kind}_ok"] = bool(at)
        out[f"control_{kind}_strong_at_trained_steps"] = at[0] if at else None
        out[f"control_ce_mean_abs_diff_nats_{kind}_max"] = max(m[f"control_ce_mean_abs_diff_nats_{kind}"]
                                                               for m in history)
    return out
