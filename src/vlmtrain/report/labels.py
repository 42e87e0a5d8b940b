"""How a job is described in tables and plots: its model and layout, then only what differs from the sweep."""

from __future__ import annotations

from collections import Counter

from vlmtrain.compose import GROUPS
from vlmtrain.report.job import COMPONENTS, FLOP_KEYS, TIME_KEYS, Job, override_items

NOT_IN_LABEL = {"model", "parallelism", "gpus_per_node", "nodes", "train.micro_batch_size", "dry_run", "output_dir"}
"""Knobs every description already shows (model, layout, GPUs, MBS columns), so deltas leave them out."""


def baseline(jobs: list[Job]) -> dict[str, str]:
    """The most common value of each knob (group choices, then every overridden key) over the sweep."""
    keys = [*GROUPS, *sorted({k for j in jobs for k, _ in override_items(j.overrides) if k not in GROUPS})]
    base = {}
    for key in keys:
        values = Counter(v for j in jobs if (v := j.knob(key)) is not None)
        if values:
            base[key] = values.most_common(1)[0][0]
    return base


def layout_text(job: Job) -> str:
    lay = job.layout
    parts = [f"{k}{lay[k]}" for k in ("tp", "pp", "vpp", "cp", "etp") if lay.get(k, 1) > 1]
    if "ep" in lay:
        parts.append(f"ep{lay['ep']}")
    return " ".join([job.choices.get("parallelism", "?"), *parts])


def shown_elsewhere(key: str) -> bool:
    return key in NOT_IN_LABEL or key.startswith("parallelism.")


def describe(job: Job, base: dict[str, str]) -> str:
    """Model and layout, then only the knobs that differ from the sweep's baseline."""
    if not job.config:
        return " ".join(job.overrides)
    deltas = [f"{k}={v}" for k in base if (v := job.knob(k)) is not None and v != base[k] and not shown_elsewhere(k)]
    return " ".join([job.choices.get("model", "?"), layout_text(job), *deltas])


def split_kind(jobs: list[Job]) -> str:
    """'time' when every job measured per-component times, else 'flops' (the model FLOP split)."""
    done = [j for j in jobs if j.metrics]
    return "time" if done and all(all(k in j.metrics for k in TIME_KEYS[:3]) for j in done) else "flops"


def split_text(job: Job, kind: str) -> str:
    m = job.metrics
    if kind == "time":
        return " / ".join(f"{c} {m[k]:.3f}" for c, k in zip(COMPONENTS, TIME_KEYS, strict=True) if k in m) + " s"
    total = sum(m.get(k, 0.0) for k in FLOP_KEYS)
    if not total:
        return ""
    return " / ".join(f"{c} {m.get(k, 0.0) / total:.1%}" for c, k in zip(COMPONENTS, FLOP_KEYS, strict=False)) + \
        " of FLOPs"


def flags(job: Job) -> str:
    return ", ".join(f for f, on in (("frozen-vision", job.frozen), ("mock-data", job.mock)) if on)
