"""Repeated runs of one benchmark case on one machine run, and their summary row: the median and the min-max spread
of each headline metric over the runs (never the best of them), so a claim carries its run-to-run spread.

A run row is a results row with `machine_run` (vlmtrain.lab.kit.store.machine_run says what it is) and `run` (its
number within the machine run); the case's summary row is `<case>_summary` with the same `machine_run` and `runs`.
Runs already recorded for a machine run are not run again (`done`), so a case's repeats may be split over several
invocations on one machine.

The peer ratio `vs_bridge_recipe` of benchmarks H1 and H2 (vlmtrain.lab.cases defines them): vlmtrain's best
median of the benchmark / Bridge's own recipe's median (useful tokens/s), written as its own row
(`vs-bridge-recipe_<machine run>` for H1, `vs-bridge-recipe-h2_<machine run>` for H2) whenever a summary of either
side lands and both exist for the machine run.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from vlmtrain.lab.kit import store
from vlmtrain.observe import run_summary

KEYS = ("useful_tokens_per_s_per_gpu", "mfu", "step_s", "peak_mem_gib", "mfu_vit", "mfu_projector", "mfu_decoder")
"""What a summary row gives the median and min/max of (a key is left out unless every run has it)."""
SUMMARY_SUFFIX = "_summary"
H1_PREFIX = "h1_"
"""Case names of benchmark H1: vlmtrain's cases and the Bridge recipe peer."""
PEER_PREFIXES = (H1_PREFIX, "h2_")
"""The benchmarks with a Bridge recipe peer (vlmtrain.lab.bridge_benchmarks): H1 and H2."""


def bridge_case(prefix: str) -> str:
    """The peer's case name of a benchmark: Bridge's own SFT recipe for its model (vlmtrain.lab.bridge_recipe)."""
    return f"{prefix}bridge-recipe"


BRIDGE_RECIPE = bridge_case(H1_PREFIX)
USEFUL = "useful_tokens_per_s_per_gpu"


def runs(rows: list[dict[str, Any]], name: str, machine_run: str) -> list[dict[str, Any]]:
    """The finished (rc 0, measured) run rows of case `name` on `machine_run`, in order."""
    return [r for r in rows if r["name"] == name and r.get("machine_run") == machine_run and "run" in r
            and not r.get("rc") and USEFUL in r["metrics"] and "superseded" not in r]


def done(path: Path, name: str, machine_run: str) -> int:
    """How many runs of `name` this machine run has recorded in the results file."""
    return len(runs(run_summary.read_jsonl(path), name, machine_run))


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


def append_summary(path: Path, name: str, machine_run: str, command: str, **extra: Any) -> dict[str, Any] | None:
    """The summary row of `name` on `machine_run` from its recorded runs (None when it has none), then the peer
    ratio."""
    mine = runs(run_summary.read_jsonl(path), name, machine_run)
    if not mine:
        return None
    metrics = summary_metrics(mine)
    row = store.append(path, name + SUMMARY_SUFFIX, command, metrics, machine_run=machine_run, case=name,
                         machine=mine[-1].get("machine", store.machine()), config=mine[-1].get("config"), **extra)
    lo, hi = metrics[USEFUL + "_min"], metrics[USEFUL + "_max"]
    print(f"[repeats] {name} ({machine_run}, {metrics['runs']} runs): median {metrics[USEFUL]:.0f} useful "
          f"tokens/s/GPU ({lo:.0f}-{hi:.0f}), step {metrics['step_s']:.2f} s", flush=True)
    for prefix in PEER_PREFIXES:
        if name.startswith(prefix):
            append_vs_bridge(path, machine_run, command, prefix)
    return row


def summaries(rows: list[dict[str, Any]], machine_run: str) -> dict[str, dict[str, Any]]:
    """The latest summary row of each case on `machine_run`, by case name."""
    return {r["case"]: r for r in rows if r["name"].endswith(SUMMARY_SUFFIX) and r.get("machine_run") == machine_run
            and "case" in r and USEFUL in r["metrics"]}


def trains_every_tower(row: dict[str, Any]) -> bool:
    """Whether a case's overrides leave every tower trainable, as the peer's recipe does (conf/vision: frozen*)."""
    return not any(o.startswith("vision=frozen") for o in row.get("config") or [])


def best_h1(rows: list[dict[str, Any]], machine_run: str,
            prefix: str = H1_PREFIX) -> tuple[str, dict[str, Any]] | None:
    """vlmtrain's best full-training case of a benchmark (H1 unless `prefix` says) on `machine_run` (highest median
    useful tokens/s/GPU) and its summary row: what vs_bridge_recipe and the towers-vs-ceiling row describe
    (frozen-tower cases are reported apart)."""
    ours = {n: r for n, r in summaries(rows, machine_run).items()
            if n.startswith(prefix) and n != bridge_case(prefix) and trains_every_tower(r)}
    if not ours:
        return None
    best = max(ours, key=lambda n: ours[n]["metrics"][USEFUL])
    return best, ours[best]


def vs_bridge(rows: list[dict[str, Any]], machine_run: str, prefix: str = H1_PREFIX) -> dict[str, Any] | None:
    """best_h1 (of the benchmark) over its Bridge recipe's median on one machine run, or None until both sides have a
    summary there."""
    peer, ours = summaries(rows, machine_run).get(bridge_case(prefix)), best_h1(rows, machine_run, prefix)
    if peer is None or ours is None:
        return None
    best, a, b = ours[0], ours[1]["metrics"], peer["metrics"]
    return {"vs_bridge_recipe": a[USEFUL] / b[USEFUL], "vlmtrain_case": best, f"vlmtrain_{USEFUL}": a[USEFUL],
            f"bridge_recipe_{USEFUL}": b[USEFUL], "vlmtrain_runs": a["runs"], "bridge_recipe_runs": b["runs"],
            "vs_bridge_recipe_mfu": a["mfu"] / b["mfu"] if a.get("mfu") and b.get("mfu") else None}


def vs_bridge_name(prefix: str, machine_run: str) -> str:
    """The ratio row's name: `vs-bridge-recipe_<machine run>` for H1 (as before H2), `vs-bridge-recipe-h2_...`."""
    return f"vs-bridge-recipe_{machine_run}" if prefix == H1_PREFIX else \
        f"vs-bridge-recipe-{prefix.rstrip('_')}_{machine_run}"


def append_vs_bridge(path: Path, machine_run: str, command: str, prefix: str = H1_PREFIX) -> dict[str, Any] | None:
    metrics = vs_bridge(run_summary.read_jsonl(path), machine_run, prefix)
    if metrics is None:
        return None
    print(f"[repeats] vs_bridge_recipe ({machine_run}): {metrics['vs_bridge_recipe']:.2f} "
          f"({metrics['vlmtrain_case']} / {bridge_case(prefix)}, medians)", flush=True)
    return store.append(path, vs_bridge_name(prefix, machine_run), command, metrics, machine_run=machine_run)
