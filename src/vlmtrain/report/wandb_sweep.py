"""A sweep as its W&B views see it: the W&B runs of its group (offline record logs under a sweep directory, or the
group through the W&B API), the jobs `vlmtrain report` ranks and classifies, and the knobs that vary across the runs
(the views' grouping keys, so a sweep over train.micro_batch_size reads as an MBS sweep)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmtrain.config.groups import CHOSEN
from vlmtrain.observe.wandb_run import RUN_CONFIG
from vlmtrain.report.job import Job
from vlmtrain.report.sources import gather, rank
from vlmtrain.report.wandb_runs import (
    job_from_wandb,
    offline_reason,
    online_runs,
    read_wandb_file,
    wandb_files,
    wandb_run_config,
)

IDENTITY = ("output_dir", "name", "wandb", "dry_run")
"""Run config keys that name a run or where it logs, not what it trains: never a knob."""
CHOICES = "choices"
"""RunConfig.choices: the option each config group picked (`choices.parallelism` = fsdp)."""


class SweepError(ValueError):
    """A source the views cannot be built from; the message names the fix."""


@dataclass
class Sweep:
    """The sweep's W&B identity (entity, project, group), its runs as read_wandb_file shapes them, and its jobs."""

    source: str
    project: str
    group: str
    entity: str | None
    runs: list[dict[str, Any]]
    jobs: list[Job]
    root: Path | None = None
    """The sweep directory (None for a W&B group)."""
    knobs: list[str] = field(init=False)
    """The run config keys that vary across the runs, group choices first (varying_knobs)."""

    def __post_init__(self) -> None:
        self.knobs = varying_knobs([wandb_run_config(r["config"]) for r in self.runs])

    def offline_runs(self) -> list[Path]:
        """The offline run directories under the sweep dir (what `wandb sync` uploads; online runs are uploaded)."""
        dirs = [p.parent for p in wandb_files(self.root)] if self.root else []
        return [d for d in dirs if d.name.startswith("offline-run-")]


def config_key(knob: str) -> str:
    """A run config key as W&B names it in the run's config (vlmtrain.observe.wandb_run.config nests it)."""
    return f"{RUN_CONFIG}.{knob}"


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested config; lists stay one value."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _names_its_run(key: str, flat: dict[str, Any]) -> bool:
    """A value that holds the run's own directory (train.checkpoint_dir's default), or an identity key."""
    value, run_dir = flat.get(key), flat.get("output_dir")
    return key.split(".")[0] in IDENTITY or (isinstance(value, str) and bool(run_dir) and run_dir in value)


def _follows_choice(key: str, flats: list[dict[str, Any]], chosen: set[str]) -> bool:
    """A group's field whose value is fixed by the group's (varying) choice: model.num_layers under model=..."""
    choice = f"{CHOICES}.{key.split('.')[0]}"
    if choice not in chosen:
        return False
    pairs = {(json.dumps(f.get(choice)), json.dumps(f.get(key), sort_keys=True)) for f in flats}
    return len(pairs) == len({c for c, _ in pairs})


def varying_knobs(configs: list[dict[str, Any]]) -> list[str]:
    """The run config keys whose value differs between runs: a group's choice stands for the fields it sets, and
    what only names a run (its directory, W&B identity) is left out. Group choices first, in the groups' order."""
    flats = [flatten(c) for c in configs]
    keys = sorted({k for f in flats for k in f})
    varying = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True) for f in flats}) > 1
               and not all(_names_its_run(k, f) for f in flats)]
    chosen = {k for k in varying if k.startswith(f"{CHOICES}.")}
    knobs = [k for k in varying if k in chosen or not _follows_choice(k, flats, chosen)]
    order = {f"{CHOICES}.{g}": i for i, g in enumerate(CHOSEN)}
    return sorted(knobs, key=lambda k: (k not in order, order.get(k, 0), k))


def _one(values: set[Any], what: str, source: str) -> Any:
    if len(values) > 1:
        raise SweepError(f"{source}: the W&B runs there belong to {len(values)} {what}s ({', '.join(map(str, values))})"
                         f"; give one sweep's directory or one wandb:<entity>/<project>/<group>")
    return next(iter(values))


def read(source: str | Path) -> Sweep:
    """The sweep behind a sweep directory (its offline W&B runs and the jobs `vlmtrain report` finds there) or a
    `wandb:<entity>/<project>/<group>` (through the W&B API)."""
    text = str(source)
    if text.startswith("wandb:"):
        spec = text.removeprefix("wandb:")
        if spec.count("/") != 2:
            raise SweepError(f"{text}: a W&B group is wandb:<entity>/<project>/<group>")
        if reason := offline_reason():
            raise SweepError(f"{text}: cannot read the group from W&B now: {reason}")
        runs = online_runs(spec)
        jobs, root = rank([job_from_wandb(r, "wandb") for r in runs]), None
    else:
        root = Path(source)
        if not root.is_dir():
            raise SweepError(f"{root}: not a directory (give a sweep's multirun dir or "
                             "wandb:<entity>/<project>/<group>)")
        runs = [read_wandb_file(p) for p in wandb_files(root)]
        jobs = gather(root)
    if not runs:
        raise SweepError(f"{text}: no W&B runs there (no job logged to W&B: wandb.enabled=false, or none started); "
                         f"`vlmtrain report {text}` still ranks the jobs")
    project = _one({r["project"] for r in runs}, "project", text)
    group = _one({r["group"] for r in runs}, "group", text)
    entity = _one({r["entity"] for r in runs}, "entity", text)
    return Sweep(source=text, project=project, group=group, entity=entity, runs=runs, jobs=jobs, root=root)
