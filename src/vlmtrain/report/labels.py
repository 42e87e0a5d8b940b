"""How a job is described in tables and plots: its model and layout, then only what differs from the sweep."""

from __future__ import annotations

import re
from collections import Counter

from vlmtrain.config.groups import CHOSEN
from vlmtrain.observe.run_summary import FLOP_KEYS, TIME_KEYS
from vlmtrain.observe.timing import data_bound
from vlmtrain.report.job import COMPONENTS, Job, override_items

NOT_IN_LABEL = {"model", "parallelism", "gpus_per_node", "nodes", "train.micro_batch_size", "dry_run", "output_dir",
                "name"}
"""Knobs every description already shows (model, layout, GPUs, MBS columns), so deltas leave them out."""
NAME_WORDS = re.compile(r"[_,\s]+")
"""Separators of the words of a run dir's name (benchmark case names, Hydra's override_dirname)."""


def baseline(jobs: list[Job]) -> dict[str, str]:
    """The most common value of each knob (group choices, then every overridden key) over the sweep."""
    keys = [*CHOSEN, *sorted({k for j in jobs for k, _ in override_items(j.overrides) if k not in CHOSEN})]
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
    """Knobs a description shows in its own words (model, layout, GPUs, MBS), or that do not change what trains."""
    return key in NOT_IN_LABEL or key.startswith(("parallelism.", "wandb."))


def describe(job: Job, base: dict[str, str]) -> str:
    """Model and layout, then only the knobs that differ from the sweep's baseline."""
    if not job.config:
        return " ".join(job.overrides) or "(no run_config.yaml or .hydra/config.yaml in the run dir)"
    deltas = [f"{k}={v}" for k in base if (v := job.knob(k)) is not None and v != base[k] and not shown_elsewhere(k)]
    return " ".join([job.choices.get("model", "?"), layout_text(job), *deltas])


def facets(job: Job, base: dict[str, str], mbs: bool = True) -> dict[str, str]:
    """What identifies a job, facet -> its text: model, layout, GPUs, every knob off the sweep's baseline, MBS. A
    job without a config: its overrides, else the words of its directory name (e.g. a benchmark case's)."""
    if not job.config:
        words = [f"{k}={v}" for k, v in override_items(job.overrides)] or NAME_WORDS.split(job.name)
        return {w: w for w in words if w}
    out = {"model": job.choices.get("model", "?"), "layout": layout_text(job)}
    if gpus := job.layout.get("gpus"):
        out["gpus"] = f"{gpus} GPU{'s' * (gpus != 1)}"
    out.update({k: f"{k}={v}" for k in base
                if not shown_elsewhere(k) and (v := job.knob(k)) is not None and v != base[k]})
    if mbs and job.mbs is not None:
        out["mbs"] = f"MBS {job.mbs}"
    return out


def distinct_labels(jobs: list[Job], base: dict[str, str], mbs: bool = True) -> list[str]:
    """Each job's facets that are not the same in all of `jobs`, so labels tell jobs apart at a glance (not a
    common prefix cut short); all facets when none differ; a label still shared (a repeated run) gets the job's
    number or name. Knobs at their baseline value are left out (baseline_note says what they are)."""
    all_facets = [facets(j, base, mbs) for j in jobs]
    varying = {k for k in {k for f in all_facets for k in f} if len({f.get(k) for f in all_facets}) > 1}
    texts = [" ".join(t for k, t in f.items() if k in varying) or " ".join(f.values()) for f in all_facets]
    counts = Counter(texts)
    return [f"{t} ({j.label})" if counts[t] > 1 else t for t, j in zip(texts, jobs, strict=True)]


def baseline_note(jobs: list[Job], base: dict[str, str]) -> str:
    """The baseline values of the knobs distinct_labels shows only where a job differs from them."""
    varying = [k for k in base if not shown_elsewhere(k) and any(j.knob(k) not in (None, base[k]) for j in jobs)]
    return ("unless the label says otherwise: " + ", ".join(f"{k}={base[k]}" for k in varying)) if varying else ""


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
    skipped = int(job.metrics.get("skipped_samples") or 0)  # bad samples the data scan dropped
    cut = int(job.metrics.get("truncated_samples") or 0)  # data.truncate_long_samples: samples cut to seq_length
    waiting = data_bound(job.metrics.get("time_data_s"), job.metrics.get("step_s"))
    workers = job.knob("data.num_workers")
    return ", ".join(f for f, on in (("frozen-vision", job.frozen), ("mock-data", job.mock),
                                     (f"{skipped} bad samples skipped", skipped),
                                     (f"{cut} long samples truncated", cut),
                                     (f"data-bound: {waiting or 0:.0%} of the step waits on the loader "
                                      f"(data.num_workers={workers})", waiting)) if on)
