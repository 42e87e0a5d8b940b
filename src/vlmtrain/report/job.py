"""A sweep job as the report sees it, and the numbers it is ranked by."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.config.groups import CHOSEN
from vlmtrain.observe.keys import VAL_LM_LOSS
from vlmtrain.observe.run_summary import SUMMARY_KEYS, steady, summarize_rows

if TYPE_CHECKING:
    from vlmtrain.check.speed import StepTime
    from vlmtrain.config.resolve import Resolved

COMPONENTS = ("ViT", "projector", "decoder", "optimizer", "data", "other")
"""The names of TIME_KEYS' components, in order."""

VAL_KEY = VAL_LM_LOSS
"""observe.metrics_callback's validation loss, on the row of the step an evaluation followed."""

SECTIONS = {
    "main": "Ranking: trainable vision, real data",
    "frozen": "Frozen vision (benchmark-only: compare only with other frozen runs)",
    "mock": "Mock data (NOT a performance run: mock images look ~2x faster than real ones)",
}
STATUS = {
    "ok": "ok",
    "oom": "out of memory",
    "nonfinite": "non-finite loss/gradient (stopped)",
    "skipped": "skipped by preflight",
    "refused": "refused before any GPU work",
    "nccl_timeout": "NCCL timeout",
    "crash": "crash",
    "dry_run": "dry run (planned, not trained)",
    "preflight_only": "passed preflight (preflight_only: not launched)",
    "incomplete": "incomplete",
}

_MISSING = object()


@dataclass
class Job:
    """One sweep job as the report sees it: where it came from, its config, its metrics and its outcome."""

    name: str
    source: str
    """files | files+wandb | wandb-offline | wandb | preflight (skipped) | preflight-launched (no job dir)"""
    num: int | None = None
    path: Path | None = None
    overrides: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    """checks.json: what the run really instantiated (trainable and frozen parameters per tower, ...)."""
    data_kind: str | None = None
    status: str = "incomplete"
    reason: str = ""
    rank: int | None = None
    validation: list[tuple[int, float]] = field(default_factory=list)
    """(step, validation loss) of every evaluation (train.eval_interval), in step order."""

    @property
    def choices(self) -> dict[str, str]:
        from_overrides = {k: v for k, v in override_items(self.overrides) if k in CHOSEN}
        return {**from_overrides, **{k: str(v) for k, v in (self.config.get("choices") or {}).items()}}

    def knob(self, key: str) -> str | None:
        """A group choice or a dotted config value as an override would spell it (config first: W&B runs have
        no overrides), else the override itself."""
        if key in CHOSEN:
            return self.choices.get(key)
        node: Any = self.config
        for part in key.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING and not isinstance(node, dict | list):
            return json.dumps(node) if isinstance(node, bool) or node is None else str(node)
        return dict(override_items(self.overrides)).get(key)

    @property
    def frozen(self) -> bool:
        """The config's vision freeze, else checks.json's (a ViT with no trainable parameter), else the choice."""
        vision = self.config.get("vision") or {}
        if "freeze_vision_model" in vision:
            return bool(vision["freeze_vision_model"])
        towers = self.checks.get("params") or {}
        if "vision" in towers:
            return towers["vision"].get("trainable") == 0 and bool(towers["vision"].get("frozen"))
        return self.choices.get("vision", "").startswith("frozen")

    @property
    def mock(self) -> bool:
        return "mock" in (self.data_kind, str((self.config.get("data") or {}).get("kind")), self.choices.get("data"))

    @property
    def section(self) -> str:
        return "mock" if self.mock else "frozen" if self.frozen else "main"

    @property
    def precision(self) -> str:
        """The precision label (bf16, fp8-tensorwise, ...) of the saved config, else of the choice, else bf16."""
        from vlmtrain.config.groups.precision import label_of

        p = self.config.get("precision") or {}
        if not p:
            return str(self.choices.get("precision") or "bf16")
        return label_of(p.get("format", "bf16"), p.get("scaling", "tensorwise"), p.get("vision", "bf16"))

    @property
    def ranking(self) -> tuple[int, int, str]:
        """Where the job ranks: its section, then its precision (BF16 first); different precisions never share
        a table, since an FP8 step does less arithmetic work per FLOP counted than a BF16 one."""
        return list(SECTIONS).index(self.section), self.precision != "bf16", self.precision

    @property
    def memory_gib(self) -> float | None:
        return (self.config.get("hardware") or {}).get("memory_gib")

    @property
    def headroom_gib(self) -> float | None:
        peak = self.metrics.get("peak_mem_gib")
        return None if peak is None or self.memory_gib is None else self.memory_gib - peak

    @property
    def mbs(self) -> int | None:
        """train.micro_batch_size from the config, else the job's override; None when neither says (not 0)."""
        value = self.knob("train.micro_batch_size")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def expected_steps(self) -> int | None:
        return (self.config.get("train") or {}).get("iterations")

    @cached_property
    def resolved(self) -> Resolved | None:
        """What the run resolved (its run.json), else config.resolve on its config (run dirs without run.json);
        None when neither is there."""
        return _saved(self.path) or _resolved(self.config)

    @cached_property
    def predicted(self) -> StepTime | None:
        """The step check.speed predicted when the run was launched (its speed.json); None for older run dirs."""
        from vlmtrain.check import speed

        return speed.step.load(self.path) if self.path is not None and self.path.is_dir() else None

    def predicted_error(self) -> float | None:
        """(predicted - measured) / measured step time, where both are known."""
        measured = self.metrics.get("step_s")
        return self.predicted.step_s / measured - 1 if self.predicted and measured else None

    @cached_property
    def layout(self) -> dict[str, int]:
        """The layout the run resolved (Job.resolved), with the GPUs its metrics imply."""
        lay = self.resolved.layout if self.resolved else None
        out = {k: getattr(lay, k) for k in ("tp", "pp", "cp", "ep", "etp")} if lay else {}
        if lay and lay.vpp:
            out["vpp"] = lay.vpp
        gpus = self.metrics.get("gpus") or (lay.world_size if lay else None)
        return {**out, "gpus": gpus} if gpus else out

    @property
    def label(self) -> str:
        if self.source == "preflight":
            return "(not launched)"
        return f"#{self.num}" if self.num is not None else self.name


def override_items(overrides: list[str]) -> list[tuple[str, str]]:
    """`key=value` pairs of Hydra overrides (`+`/`++` prefixes dropped, hydra.* and deletions left out)."""
    items = []
    for o in overrides:
        key, sep, value = o.lstrip("+").partition("=")
        if sep and not key.startswith(("~", "hydra.")):
            items.append((key, value))
    return items


def _saved(path: Path | None) -> Resolved | None:
    """The run dir's run.json (config.resolve), None when there is none."""
    from vlmtrain.config import resolve

    return resolve.load(path) if path is not None and path.is_dir() else None


def _resolved(config: dict[str, Any]) -> Resolved | None:
    """config.resolve on the run's config (auto EP resolved); None if the config is not a RunConfig."""
    from omegaconf.errors import OmegaConfBaseException

    from vlmtrain.config.compose import load_run
    from vlmtrain.config.resolve import resolve
    from vlmtrain.config.schema import RunConfig

    known = {k: v for k, v in config.items() if k in RunConfig.__dataclass_fields__}
    if not all(k in known for k in ("model", "parallelism", "hardware")):
        return None
    try:
        return resolve(load_run(known))
    except (OmegaConfBaseException, ValueError, TypeError, KeyError, ZeroDivisionError):
        return None


def validation_curve(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, val_lm_loss) of the rows an evaluation followed (metrics.jsonl or W&B history), in step order."""
    return sorted((int(r["step"]), float(r[VAL_KEY])) for r in rows
                  if isinstance(r.get(VAL_KEY), int | float) and isinstance(r.get("step"), int | float))


def steady_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """observe.run_summary.summarize_rows over the step rows only (W&B history also holds other rows), with the
    component medians and the GPU count the token rates imply (what ran, which Job.layout prefers to the config)."""
    rows = [r for r in rows if isinstance(r.get("step_s"), int | float) and "useful_tokens_per_s_per_gpu" in r]
    out = summarize_rows(rows, keys=SUMMARY_KEYS)
    gpus = [r["nonpad_tokens"] / r["step_s"] / r["useful_tokens_per_s_per_gpu"] for r in steady(rows)
            if r.get("nonpad_tokens") and r["useful_tokens_per_s_per_gpu"]]
    if gpus:
        out["gpus"] = round(statistics.median(gpus))
    curve = validation_curve(rows)
    if curve:  # the last evaluation's loss: the held-out figure a sweep compares
        out["val_loss"] = curve[-1][1]
    return out
