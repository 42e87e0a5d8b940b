"""The peer ratio of benchmarks H1 and H2 (vlmtrain.lab.kit.baselines defines them): vlmtrain's best median of the
benchmark / Bridge's own recipe's median (useful tokens/s), on one machine run, written as its own row
(`vs-bridge-recipe_<machine run>` for H1, `vs-bridge-recipe-h2_<machine run>` for H2) whenever a summary of either
side lands (`after_summary`) and both exist for the machine run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlmtrain.lab.kit import schedule, store
from vlmtrain.lab.kit.schedule import USEFUL

H1_PREFIX = "h1_"
"""Case names of benchmark H1: vlmtrain's cases and the Bridge recipe peer."""
PEER_PREFIXES = (H1_PREFIX, "h2_")
"""The benchmarks with a Bridge recipe peer (vlmtrain.lab.bridge_benchmarks): H1 and H2."""


def bridge_case(prefix: str) -> str:
    """The peer's case name of a benchmark: Bridge's own SFT recipe for its model (vlmtrain.lab.bridge_recipe)."""
    return f"{prefix}bridge-recipe"


BRIDGE_RECIPE = bridge_case(H1_PREFIX)


def after_summary(path: Path, machine_run: str, command: str) -> Callable[[str], object]:
    """What a schedule's summary of a case does next (schedule.summary's `then`): the ratio row of the case's
    benchmark, when it has a peer."""
    def then(name: str) -> None:
        for prefix in PEER_PREFIXES:
            if name.startswith(prefix):
                append_vs_bridge(path, machine_run, command, prefix)

    return then


def trains_every_tower(row: dict[str, Any]) -> bool:
    """Whether a case's overrides leave every tower trainable, as the peer's recipe does (conf/vision: frozen*)."""
    return not any(o.startswith("vision=frozen") for o in row.get("config") or [])


def best_h1(rows: list[dict[str, Any]], machine_run: str,
            prefix: str = H1_PREFIX) -> tuple[str, dict[str, Any]] | None:
    """vlmtrain's best full-training case of a benchmark (H1 unless `prefix` says) on `machine_run` (highest median
    useful tokens/s/GPU) and its summary row: what vs_bridge_recipe and the towers-vs-ceiling row describe
    (frozen-tower cases are reported apart)."""
    ours = {n: r for n, r in schedule.summaries(rows, machine_run).items()
            if n.startswith(prefix) and n != bridge_case(prefix) and trains_every_tower(r)}
    if not ours:
        return None
    best = max(ours, key=lambda n: ours[n]["metrics"][USEFUL])
    return best, ours[best]


def vs_bridge(rows: list[dict[str, Any]], machine_run: str, prefix: str = H1_PREFIX) -> dict[str, Any] | None:
    """best_h1 (of the benchmark) over its Bridge recipe's median on one machine run, or None until both sides have a
    summary there."""
    peer, ours = schedule.summaries(rows, machine_run).get(bridge_case(prefix)), best_h1(rows, machine_run, prefix)
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
    metrics = vs_bridge(store.read(path), machine_run, prefix)
    if metrics is None:
        return None
    print(f"[repeats] vs_bridge_recipe ({machine_run}): {metrics['vs_bridge_recipe']:.2f} "
          f"({metrics['vlmtrain_case']} / {bridge_case(prefix)}, medians)", flush=True)
    return store.append(path, vs_bridge_name(prefix, machine_run), command, metrics, machine_run=machine_run)
