"""Repeated runs of one benchmark case on one machine lease, and their summary row: the median and the min-max spread
of each headline metric over the runs (never the best of them), so a claim carries its run-to-run spread.

A run row is a results row with `lease` (vlmtrain.lab.store.lease: the machine's boot id) and `run` (its number
within the lease); the case's summary row is `<case>_summary` with the same `lease` and `runs`. Runs already recorded
for a lease are not run again (`done`), so a case's repeats may be split over several device calls.

The issue-23 peer ratio `vs_bridge_recipe` (vlmtrain's best H1 median / Bridge's own recipe's median, useful tokens/s)
is written as its own row whenever a summary of either side lands and both exist for the lease.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from vlmtrain.lab import store
from vlmtrain.observe import run_summary

KEYS = ("useful_tokens_per_s_per_gpu", "mfu", "step_s", "peak_mem_gib", "mfu_vit", "mfu_projector", "mfu_decoder")
"""What a summary row gives the median and min/max of (a key is left out unless every run has it)."""
SUMMARY_SUFFIX = "_summary"
H1_PREFIX = "h1_"
"""Case names of the issue-23 benchmark H1 (one H200): vlmtrain's cases and the Bridge recipe peer."""
BRIDGE_RECIPE = "h1_bridge-recipe"
"""The peer's case name: Bridge's own Qwen3-VL-30B-A3B SFT recipe at H1 (vlmtrain.lab.bridge_recipe)."""
USEFUL = "useful_tokens_per_s_per_gpu"


def runs(rows: list[dict[str, Any]], name: str, lease: str) -> list[dict[str, Any]]:
    """The finished (rc 0, measured) run rows of case `name` on `lease`, in order."""
    return [r for r in rows if r["name"] == name and r.get("lease") == lease and "run" in r and not r.get("rc")
            and USEFUL in r["metrics"] and "superseded" not in r]


def done(path: Path, name: str, lease: str) -> int:
    """How many runs of `name` this lease has recorded in the results file."""
    return len(runs(run_summary.read_jsonl(path), name, lease))


def spread(values: list[float], key: str) -> dict[str, float]:
    return {key: statistics.median(values), f"{key}_min": min(values), f"{key}_max": max(values)}


def summary_metrics(run_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and min/max of KEYS over the runs (a key every run has), and `runs`."""
    out: dict[str, Any] = {"runs": len(run_rows)}
    for key in KEYS:
        values = [r["metrics"].get(key) for r in run_rows]
        if values and all(isinstance(v, int | float) for v in values):
            out |= spread(values, key)
    return out


def append_summary(path: Path, name: str, lease: str, command: str, **extra: Any) -> dict[str, Any] | None:
    """The summary row of `name` on `lease` from its recorded runs (None when it has none), then the peer ratio."""
    mine = runs(run_summary.read_jsonl(path), name, lease)
    if not mine:
        return None
    metrics = summary_metrics(mine)
    row = store.append(path, name + SUMMARY_SUFFIX, command, metrics, lease=lease, case=name,
                         machine=mine[-1].get("machine", store.machine()), config=mine[-1].get("config"), **extra)
    lo, hi = metrics[USEFUL + "_min"], metrics[USEFUL + "_max"]
    print(f"[repeats] {name} ({lease}, {metrics['runs']} runs): median {metrics[USEFUL]:.0f} useful tokens/s/GPU "
          f"({lo:.0f}-{hi:.0f}), step {metrics['step_s']:.2f} s", flush=True)
    if name.startswith(H1_PREFIX):
        append_vs_bridge(path, lease, command)
    return row


def summaries(rows: list[dict[str, Any]], lease: str) -> dict[str, dict[str, Any]]:
    """The latest summary row of each case on `lease`, by case name."""
    return {r["case"]: r for r in rows if r["name"].endswith(SUMMARY_SUFFIX) and r.get("lease") == lease
            and "case" in r and USEFUL in r["metrics"]}


def trains_every_tower(row: dict[str, Any]) -> bool:
    """Whether a case's overrides leave every tower trainable, as the peer's recipe does (conf/vision: frozen*)."""
    return not any(o.startswith("vision=frozen") for o in row.get("config") or [])


def best_h1(rows: list[dict[str, Any]], lease: str) -> tuple[str, dict[str, Any]] | None:
    """vlmtrain's best full-training H1 case on `lease` (highest median useful tokens/s/GPU) and its summary row:
    what vs_bridge_recipe and the towers-vs-ceiling row describe (frozen-tower cases are reported apart)."""
    ours = {n: r for n, r in summaries(rows, lease).items()
            if n.startswith(H1_PREFIX) and n != BRIDGE_RECIPE and trains_every_tower(r)}
    if not ours:
        return None
    best = max(ours, key=lambda n: ours[n]["metrics"][USEFUL])
    return best, ours[best]


def vs_bridge(rows: list[dict[str, Any]], lease: str) -> dict[str, Any] | None:
    """best_h1 over the Bridge recipe's median on one lease, or None until both sides have a summary there."""
    peer, ours = summaries(rows, lease).get(BRIDGE_RECIPE), best_h1(rows, lease)
    if peer is None or ours is None:
        return None
    best, a, b = ours[0], ours[1]["metrics"], peer["metrics"]
    return {"vs_bridge_recipe": a[USEFUL] / b[USEFUL], "vlmtrain_case": best, f"vlmtrain_{USEFUL}": a[USEFUL],
            f"bridge_recipe_{USEFUL}": b[USEFUL], "vlmtrain_runs": a["runs"], "bridge_recipe_runs": b["runs"],
            "vs_bridge_recipe_mfu": a["mfu"] / b["mfu"] if a.get("mfu") and b.get("mfu") else None}


def append_vs_bridge(path: Path, lease: str, command: str) -> dict[str, Any] | None:
    metrics = vs_bridge(run_summary.read_jsonl(path), lease)
    if metrics is None:
        return None
    print(f"[repeats] vs_bridge_recipe ({lease}): {metrics['vs_bridge_recipe']:.2f} "
          f"({metrics['vlmtrain_case']} / {BRIDGE_RECIPE}, medians)", flush=True)
    return store.append(path, f"vs-bridge-recipe_{lease}", command, metrics, lease=lease)
