"""What the packing equivalence check accepts (vlmtrain.lab.checks.packing_equivalence): the tolerances of the
packed-vs-alone comparison, and the bar a negative control must clear, both measured at each model state.

Two differences at a state come from BF16 rounding alone: the packed-vs-alone comparison itself (one row of all
samples vs one sample: GEMMs of other shapes round differently) and `whole_row_positions` (every position of a later
sample shifted by one constant, which RoPE attention cancels up to rounding). Their larger is the state's rounding
floor. The comparison passes when it stays within ROUNDING_MARGIN of what rounding alone made at that state (and
within the fixed absolute tolerances); a control proves the check could fail when it misses that accepted bound by
CONTROL_MARGIN, at a state where the comparison passes. So a control is judged against the same state's own noise,
not a fixed figure that a small model's weak controls never reach.
"""

from __future__ import annotations

from typing import Any

CE_MEAN_TOL_NATS = 0.01
"""Largest accepted mean |CE packed - CE alone| over the loss tokens at any state, fixed before the first GPU run:
bf16 GEMMs of different shapes (one row of all samples vs one sample) round differently in every layer."""
CE_P99_TOL_NATS = 0.05
"""Largest accepted 99th percentile of the per-token |CE| difference."""
GRAD_COSINE_MIN = 0.99
"""Smallest accepted cosine between the packed gradient and the sum of the alone ones."""
ROUNDING_MARGIN = 3.0
"""The comparison's mean difference may be this many times the state's rounding-only `whole_row_positions`
difference: over every recorded state of every case (results/packing_equivalence.jsonl, 2026-12-01/02 and the
2026-12-07 Qwen3.5 hand-over) their ratio stayed at or below 1.35."""
CONTROL_MARGIN = 2.0
"""A control must differ by at least this many times what the check accepts at the same state (so at least
ROUNDING_MARGIN x CONTROL_MARGIN = 6 times the rounding floor), or the check could not have failed."""
CONTROLS = ("positions", "boundaries")
GDN_CONTROLS = ("gdn_boundaries",)
"""Models with Gated DeltaNet layers (Qwen3.5) also: those layers run the row as one sequence
(vlmtrain.lab.checks.packing_gdn_control), the attention layers and the positions keep each sample's."""
CHECKS = ("whole_row_positions",)
"""Recorded beside the controls, expected to change nothing but rounding (packing_equivalence's docstring says
why): the state's rounding floor."""
FLOOR = "check_ce_mean_abs_diff_nats_whole_row_positions"
LATER = "ce_mean_abs_diff_nats_later_samples"
"""The comparison on the tokens a control can change (each row's samples after the first)."""


def rounding_floor(m: dict[str, Any]) -> float:
    """The larger of the state's two rounding-only differences (module docstring)."""
    return max(m.get(FLOOR, 0.0), m.get(LATER, 0.0))


def accepted(m: dict[str, Any]) -> float:
    """The largest mean CE difference the check accepts at this state."""
    return min(CE_MEAN_TOL_NATS, ROUNDING_MARGIN * m.get(FLOOR, CE_MEAN_TOL_NATS))


def control_bar(m: dict[str, Any]) -> float:
    """The mean CE difference a control must reach at this state."""
    return CONTROL_MARGIN * max(accepted(m), rounding_floor(m))


def passes(m: dict[str, Any]) -> dict[str, bool]:
    """The packed-vs-alone comparison of one model state against the tolerances."""
    ok = {f"{k}_ok": m[k] <= accepted(m) for k in m if k.startswith("ce_mean_abs_diff_nats")}
    ok |= {f"{k}_ok": m[k] <= CE_P99_TOL_NATS for k in m if k.startswith("ce_p99_abs_diff_nats")}
    ok |= {f"{k}_ok": m[k] >= GRAD_COSINE_MIN for k in m if k.startswith("grad_cosine")}
    return ok


def strong(m: dict[str, Any], kind: str) -> bool:
    """The control misses the accepted bound by CONTROL_MARGIN at a state where the comparison passes."""
    return m[f"control_ce_mean_abs_diff_nats_{kind}"] >= control_bar(m) and all(passes(m).values())


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
    out["control_bar_nats_max"] = max(control_bar(m) for m in history)
    out["passed"] = out["comparison_ok"] and all(out[f"control_{k}_ok"] for k in measured_controls(history[0]))
    return out
