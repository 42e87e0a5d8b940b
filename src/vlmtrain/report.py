"""Sweep report: rank a Hydra multirun (or a W&B group) by useful tokens/s/GPU, explain every failure, plot.

    vlmtrain report <multirun dir | run dir | wandb:<entity>/<project>/<group>> [--out DIR]

Each job is read from its own files (run_config.yaml, metrics.jsonl, train.log, .hydra/), from W&B offline
run files found under the directory, or from the W&B API for `wandb:` groups. Numbers follow
vlmtrain.results.summarize: medians over the steps after the first SKIP (compilation, graph capture and
allocator growth). Frozen-vision and mock-data runs get their own sections: their throughput is not comparable
with trainable runs on real data. Writes report.md, report.csv and three PNG plots.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from vlmtrain.compose import GROUPS
from vlmtrain.results import read_jsonl

SKIP = 3
"""Warm-up steps left out of every median (as vlmtrain.results.summarize)."""
TIME_KEYS = ("time_vision_s", "time_projector_s", "time_decoder_s", "time_optimizer_s", "time_data_s", "time_other_s")
"""vlmtrain.timing's per-component seconds of a step (rank 0); `other` = step_s minus the named ones."""
FLOP_KEYS = ("flops_vit", "flops_projector", "flops_decoder")
COMPONENTS = ("ViT", "projector", "decoder", "optimizer", "data", "other")
MEDIAN_KEYS = ("step_s", "useful_tokens_per_s_per_gpu", "padded_tokens_per_s_per_gpu", "tflops_per_s_per_gpu", "mfu",
               *TIME_KEYS, *FLOP_KEYS)
LOG_TAIL_BYTES = 4 << 20
LOG_GLOBS = ("*.log", "*.err", "*.out")
PLOTS = {"throughput": "throughput_vs_mbs.png", "split": "component_split.png", "memory": "memory_vs_throughput.png"}

SECTIONS = {
    "main": "Ranking: trainable vision, real data",
    "frozen": "Frozen vision (benchmark-only: compare only with other frozen runs)",
    "mock": "Mock data (NOT a performance run: mock images look ~2x faster than real ones)",
}
STATUS = {
    "ok": "ok",
    "oom": "out of memory",
    "skipped": "skipped by preflight",
    "nccl_timeout": "NCCL timeout",
    "crash": "crash",
    "dry_run": "dry run (planned, not trained)",
    "incomplete": "incomplete",
}

OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED")
NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|ran for \d+ milliseconds before timing out")
"""PyTorch's ProcessGroupNCCL watchdog lines (not its init banner, which prints the TIMEOUT(ms) setting)."""
RANK_PREFIX = re.compile(r"^\[(?:rank|Rank )?\d+\]:\s?")
BRIDGE_FAILURE = re.compile(r"Pretrain failed on rank=\d+ with (\w+): (.*?)(?:\. Bridge is aborting.*)?$")
EXIT_CODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
WRAPPER_EXCEPTIONS = ("ChildFailedError",)
"""Launcher exceptions that only say a rank failed; the rank's own exception is the one to report."""
FINDING = re.compile(r"^\[(\w+)\]\s+(\w+):\s*(.*)$", re.DOTALL)
NOT_IN_LABEL = {"model", "parallelism", "gpus_per_node", "nodes", "train.micro_batch_size", "dry_run", "output_dir"}
"""Knobs every description already shows (model, layout, GPUs, MBS columns), so deltas leave them out."""


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
    data_kind: str | None = None
    status: str = "incomplete"
    reason: str = ""
    rank: int | None = None

    @property
    def choices(self) -> dict[str, str]:
        from_overrides = {k: v for k, v in _override_items(self.overrides) if k in GROUPS}
        return {**from_overrides, **{k: str(v) for k, v in (self.config.get("choices") or {}).items()}}

    def knob(self, key: str) -> str | None:
        """A group choice or a dotted config value as an override would spell it (config first: W&B runs have
        no overrides), else the override itself."""
        if key in GROUPS:
            return self.choices.get(key)
        node: Any = self.config
        for part in key.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING and not isinstance(node, dict | list):
            return json.dumps(node) if isinstance(node, bool) or node is None else str(node)
        return dict(_override_items(self.overrides)).get(key)

    @property
    def frozen(self) -> bool:
        vision = self.config.get("vision") or {}
        return bool(vision.get("freeze_vision_model", self.choices.get("vision", "").startswith("frozen")))

    @property
    def mock(self) -> bool:
        return "mock" in (self.data_kind, str((self.config.get("data") or {}).get("kind")), self.choices.get("data"))

    @property
    def section(self) -> str:
        return "mock" if self.mock else "frozen" if self.frozen else "main"

    @property
    def memory_gib(self) -> float | None:
        return (self.config.get("hardware") or {}).get("memory_gib")

    @property
    def headroom_gib(self) -> float | None:
        peak = self.metrics.get("peak_mem_gib")
        return None if peak is None or self.memory_gib is None else self.memory_gib - peak

    @property
    def mbs(self) -> int | None:
        return (self.config.get("train") or {}).get("micro_batch_size")

    @property
    def expected_steps(self) -> int | None:
        return (self.config.get("train") or {}).get("iterations")

    @cached_property
    def layout(self) -> dict[str, int]:
        lay = _layout(self.config)
        out = {k: getattr(lay, k) for k in ("tp", "pp", "cp", "ep", "etp")} if lay else {}
        if lay and lay.vpp:
            out["vpp"] = lay.vpp
        gpus = self.metrics.get("gpus") or (lay.world_size if lay else None)
        return {**out, "gpus": gpus} if gpus else out

    @property
    def short_label(self) -> str:
        """The label cut for plots, where a W&B run name would cover the neighbours."""
        return self.label if len(self.label) <= 14 else self.label[:13] + "…"

    @property
    def label(self) -> str:
        if self.source == "preflight":
            return "(not launched)"
        return f"#{self.num}" if self.num is not None else self.name


# --- reading ----------------------------------------------------------------------------------------------


def _override_items(overrides: list[str]) -> list[tuple[str, str]]:
    """`key=value` pairs of Hydra overrides (`+`/`++` prefixes dropped, hydra.* and deletions left out)."""
    items = []
    for o in overrides:
        key, sep, value = o.lstrip("+").partition("=")
        if sep and not key.startswith(("~", "hydra.")):
            items.append((key, value))
    return items


def _layout(config: dict[str, Any]) -> Any:
    """The run's world layout through vlmtrain.world (auto EP resolved); None if the config is not a RunConfig."""
    from omegaconf.errors import OmegaConfBaseException

    from vlmtrain import world
    from vlmtrain.schema import RunConfig

    known = {k: v for k, v in config.items() if k in RunConfig.__dataclass_fields__}
    if not all(k in known for k in ("model", "parallelism", "hardware")):
        return None
    try:
        return world.layout(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), known)))
    except (OmegaConfBaseException, ValueError, TypeError, KeyError, ZeroDivisionError):
        return None


def steady_metrics(rows: list[dict[str, Any]], skip: int = SKIP) -> dict[str, Any]:
    """Headline and component numbers of one run's step rows (the rule of vlmtrain.results.summarize)."""
    rows = [r for r in rows if isinstance(r.get("step_s"), int | float) and "useful_tokens_per_s_per_gpu" in r]
    if not rows:
        return {}
    steady = rows[skip:] or rows[-1:]
    out: dict[str, Any] = {"steps": len(rows), "peak_mem_gib": max(r.get("peak_mem_gib", 0.0) for r in rows)}
    for key in MEDIAN_KEYS:
        values = [r[key] for r in steady if isinstance(r.get(key), int | float)]
        if values:
            out[key] = statistics.median(values)
    padded = sum(r.get("padded_tokens", 0) for r in steady)
    if padded:
        out["nonpad_fraction"] = sum(r.get("nonpad_tokens", 0) for r in steady) / padded
    gpus = [r["nonpad_tokens"] / r["step_s"] / r["useful_tokens_per_s_per_gpu"] for r in steady
            if r.get("nonpad_tokens") and r["useful_tokens_per_s_per_gpu"]]
    if gpus:
        out["gpus"] = round(statistics.median(gpus))
    losses = [r["lm_loss"] for r in rows if isinstance(r.get("lm_loss"), int | float)]
    if losses:
        out.update(first_loss=losses[0], last_loss=losses[-1])
    return out


def _tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    with path.open("rb") as f:
        f.seek(max(path.stat().st_size - limit, 0))
        return f.read().decode("utf-8", errors="replace")


def log_text(job_dir: Path) -> str:
    """The tail of every log the job wrote into its directory (Hydra's train.log, launcher .out/.err)."""
    files = sorted({p for g in LOG_GLOBS for p in job_dir.glob(g) if p.is_file()})
    return "\n".join(_tail(p) for p in files)


def exception_lines(text: str) -> list[str]:
    """The exception line that ends each Python traceback in a log, in order ('[rankN]: ' prefixes dropped)."""
    out, in_tb = [], False
    for raw in text.splitlines():
        line = RANK_PREFIX.sub("", raw)
        if line.startswith("Traceback (most recent call last)"):
            in_tb = True
        elif in_tb and line.strip() and not line[0].isspace():
            out.append(line.strip())
            in_tb = False
    return out


def _root_exception(text: str) -> str | None:
    """The last exception that is not a launcher wrapper, else the wrapper with the rank's exit code."""
    lines = exception_lines(text)
    own = [ln for ln in lines if not any(w in ln.split(":")[0] for w in WRAPPER_EXCEPTIONS)]
    if own:
        return own[-1]
    if lines:
        codes = EXIT_CODE.findall(text)
        return lines[-1].rstrip(": ") + (f" (exitcode {codes[-1]})" if codes else "")
    return None


def _matching_line(pattern: re.Pattern[str], text: str, last: bool = False) -> str | None:
    hits = [RANK_PREFIX.sub("", ln).strip() for ln in text.splitlines() if pattern.search(ln)]
    return (hits[-1] if last else hits[0]) if hits else None


def classify(text: str, steps: int, expected_steps: int | None = None, dry_run: bool = False,
             ended: bool | None = None) -> tuple[str, str]:
    """(status, reason) of a job from its log text, how many metric rows it wrote and whether its end-of-training
    checks ran (`ended`; None when unknown)."""
    if line := _matching_line(OOM, text, last=True):
        return "oom", line
    if line := _matching_line(NCCL_TIMEOUT, text):
        return "nccl_timeout", line
    if line := _root_exception(text):
        return "crash", line
    if m := BRIDGE_FAILURE.search(text):
        return "crash", f"{m.group(1)}: {m.group(2)}"
    if steps == 0 and dry_run:
        return "dry_run", "bridge_config.yaml only"
    if steps == 0:
        return "incomplete", "no metrics and no error in the logs"
    if expected_steps and steps < expected_steps:
        return "incomplete", f"{steps}/{expected_steps} steps and no error in the logs"
    if ended is False:
        return "incomplete", "checks.json has no end-of-training checks: the run stopped after its last step"
    return "ok", ""


def _load_yaml(path: Path) -> Any:
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False) if path.exists() else None


def _job_config(job_dir: Path) -> dict[str, Any]:
    """run_config.yaml (the resolved RunConfig), else Hydra's composed config with its runtime choices."""
    config = _load_yaml(job_dir / "run_config.yaml")
    if config:
        return config
    config = _load_yaml(job_dir / ".hydra" / "config.yaml") or {}
    hydra = _load_yaml(job_dir / ".hydra" / "hydra.yaml") or {}
    choices = ((hydra.get("hydra") or {}).get("runtime") or {}).get("choices") or {}
    if choices and not config.get("choices"):
        config["choices"] = {g: str(v) for g, v in choices.items() if g in GROUPS and v is not None}
    return config


def _job_num(name: str) -> int | None:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else None


def job_from_dir(job_dir: Path) -> Job:
    """One job from the files its run wrote."""
    rows = read_jsonl(job_dir / "metrics.jsonl")
    job = Job(name=job_dir.name, source="files", num=_job_num(job_dir.name), path=job_dir,
              overrides=list(_load_yaml(job_dir / ".hydra" / "overrides.yaml") or []), config=_job_config(job_dir),
              metrics=steady_metrics(rows), data_kind=rows[0].get("data_kind") if rows else None)
    job.status, job.reason = classify(log_text(job_dir), job.metrics.get("steps", 0), job.expected_steps,
                                      dry_run=(job_dir / "bridge_config.yaml").exists(), ended=_ended(job_dir))
    return job


def _ended(job_dir: Path) -> bool | None:
    """Whether checks.json holds the after-training checks (MetricsCallback writes them in on_train_end)."""
    path = job_dir / "checks.json"
    if not path.exists():
        return None
    try:
        return "frozen_unchanged" in json.loads(path.read_text())
    except (json.JSONDecodeError, TypeError):
        return False


def _is_job_dir(path: Path) -> bool:
    return path.is_dir() and any((path / f).exists() for f in (".hydra", "run_config.yaml", "metrics.jsonl"))


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The sweep's job directories in job order (or the directory itself when it is one run)."""
    if _is_job_dir(sweep_dir) and not (sweep_dir / "multirun.yaml").exists():
        return [sweep_dir]
    dirs = [d for d in sweep_dir.iterdir() if _is_job_dir(d)]
    return sorted(dirs, key=lambda d: (_job_num(d.name) is None, _job_num(d.name) or 0, d.name))


# --- W&B ------------------------------------------------------------------------------------------------


def _wandb_item(item: Any) -> tuple[str, Any]:
    """(key, value) of a W&B record item; nested keys (media, nested summaries) come back as nested dicts."""
    value = json.loads(item.value_json)
    if item.key:
        return item.key, value
    keys = list(item.nested_key)
    for k in reversed(keys[1:]):
        value = {k: value}
    return keys[0], value


def _merge(d: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, dict) and isinstance(d.get(key), dict):
        for k, v in value.items():
            _merge(d[key], k, v)
    else:
        d[key] = value


def read_wandb_file(path: Path) -> dict[str, Any]:
    """An offline run's .wandb record log as {name, group, config, history, output, exit_code} (wandb 0.29)."""
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    out: dict[str, Any] = {"name": path.stem, "group": None, "config": {}, "history": [], "output": [],
                           "exit_code": None}
    ds = datastore.DataStore()
    ds.open_for_scan(str(path))
    try:
        while (data := ds.scan_data()) is not None:
            rec = pb.Record()
            rec.ParseFromString(data)
            _apply_record(out, rec)
    finally:
        ds.close()
    out["config"].pop("_wandb", None)
    return out


def _apply_record(out: dict[str, Any], rec: Any) -> None:
    kind = rec.WhichOneof("record_type")
    if kind == "run":
        out.update(name=rec.run.display_name or rec.run.run_id, group=rec.run.run_group or None)
        for it in rec.run.config.update:
            _merge(out["config"], *_wandb_item(it))
    elif kind == "config":
        for it in rec.config.update:
            _merge(out["config"], *_wandb_item(it))
    elif kind == "history":
        row: dict[str, Any] = {}
        for it in rec.history.item:
            _merge(row, *_wandb_item(it))
        out["history"].append(row)
    elif kind in ("output", "output_raw"):
        out["output"].append(getattr(rec, kind).line)
    elif kind == "exit":
        out["exit_code"] = rec.exit.exit_code


def _wandb_config(config: dict[str, Any]) -> dict[str, Any]:
    """The run config inside a W&B config: vlmtrain.wandb_log stores {"vlmtrain": run config, "bridge": ...}."""
    inner = config.get("vlmtrain")
    return inner if isinstance(inner, dict) else config


def job_from_wandb(run: dict[str, Any], source: str) -> Job:
    """One job from a W&B run (offline record log or API), classified from its console output and exit."""
    rows = [r for r in run["history"] if "useful_tokens_per_s_per_gpu" in r]
    job = Job(name=run["name"], source=source, config=_wandb_config(run["config"]), metrics=steady_metrics(rows),
              data_kind=rows[0].get("data_kind") if rows else None)
    text = "".join(run["output"])
    job.status, job.reason = classify(text, job.metrics.get("steps", 0), job.expected_steps)
    if job.status in ("ok", "incomplete") and run["exit_code"] not in (None, 0):
        job.status, job.reason = "crash", f"W&B run exited with code {run['exit_code']}"
    if job.status == "ok" and run["exit_code"] is None:
        job.status, job.reason = "incomplete", "W&B run has no exit record (still running or killed)"
    return job


def wandb_files(root: Path) -> list[Path]:
    return sorted(root.glob("**/wandb/*run-*/run-*.wandb"))


def attach_wandb(root: Path, jobs: list[Job]) -> list[Job]:
    """W&B runs under the sweep: a run inside a job dir fills that job's gaps; any other run is a job of its own."""
    extra = []
    for path in wandb_files(root):
        run = read_wandb_file(path)
        owner = next((j for j in jobs if j.path and j.path in path.parents and j.path != root), None)
        if owner is None:
            extra.append(job_from_wandb(run, "wandb-offline"))
            continue
        if not owner.metrics:
            found = job_from_wandb(run, "wandb-offline")
            owner.metrics, owner.data_kind, owner.source = found.metrics, found.data_kind, "files+wandb"
            owner.config = owner.config or found.config
            if owner.status in ("incomplete", "dry_run"):
                owner.status, owner.reason = found.status, found.reason
    return extra


def online_jobs(spec: str) -> list[Job]:
    """Runs of one W&B group through the public API: spec = `<entity>/<project>/<group>` (needs network + key)."""
    import wandb

    project, _, group = spec.rpartition("/")
    jobs = []
    for api_run in wandb.Api().runs(project, filters={"group": group}):
        exit_code = {"finished": 0, "crashed": 1, "failed": 1, "killed": 137}.get(api_run.state)
        run = {"name": api_run.name, "config": dict(api_run.config), "history": list(api_run.scan_history()),
               "output": [], "exit_code": exit_code}
        jobs.append(job_from_wandb(run, "wandb"))
    return jobs


# --- gathering --------------------------------------------------------------------------------------------


def _parse_finding(text: str) -> tuple[str, str, str]:
    m = FINDING.match(text.strip())
    return (m.group(1), m.group(2), m.group(3)) if m else ("error", "preflight", text)


def _skip_reason(findings: list[str]) -> str:
    parsed = [_parse_finding(f) for f in findings]
    errors = [p for p in parsed if p[0] == "error"] or parsed
    return "; ".join(f"{rule}: {msg}" for _, rule, msg in errors)


def _override_key(overrides: list[str]) -> frozenset[str]:
    return frozenset(o for o in overrides if not o.lstrip("+").startswith(("hydra.", "dry_run=")))


def preflight_jobs(sweep_dir: Path, jobs: list[Job]) -> list[Job]:
    """preflight.json (vlmtrain's sweeper): skipped jobs with their findings (a job dir with the same overrides is
    marked skipped), and launched jobs (numbered in list order) that never made a job directory."""
    path = sweep_dir / "preflight.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    by_key = {_override_key(j.overrides): j for j in jobs if j.overrides}
    new = []
    for entry in data.get("skipped", []):
        overrides = list(entry.get("overrides") or [])
        job = by_key.get(_override_key(overrides)) or Job(name=entry.get("job") or " ".join(overrides),
                                                          source="preflight", overrides=overrides)
        job.status, job.reason = "skipped", _skip_reason(list(entry.get("findings") or []))
        if job.source == "preflight":
            new.append(job)
    for num, overrides in enumerate(data.get("launched", [])):
        if _override_key(list(overrides)) not in by_key:
            new.append(Job(name=" ".join(overrides), source="preflight-launched", num=num, overrides=list(overrides),
                           reason="launched, but no job directory was written (never started?)"))
    return new


def gather(source: str | Path) -> list[Job]:
    """Every job of a sweep directory (files, W&B offline runs, preflight skips) or of a `wandb:` group."""
    if str(source).startswith("wandb:"):
        return rank(online_jobs(str(source).removeprefix("wandb:")))
    root = Path(source)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory (give a multirun dir, a run dir or wandb:<e>/<p>/<group>)")
    jobs = [job_from_dir(d) for d in job_dirs(root)]
    jobs += attach_wandb(root, jobs)
    jobs += preflight_jobs(root, jobs)
    return rank(jobs)


def rank(jobs: list[Job]) -> list[Job]:
    """Finished jobs ranked by useful tokens/s/GPU inside their section; the others keep their order at the end."""
    done = [j for j in jobs if j.status == "ok" and j.metrics]
    for section in SECTIONS:
        ordered = sorted((j for j in done if j.section == section),
                         key=lambda j: -j.metrics["useful_tokens_per_s_per_gpu"])
        for i, job in enumerate(ordered, 1):
            job.rank = i
    order = list(SECTIONS)
    ranked = sorted(done, key=lambda j: (order.index(j.section), j.rank))
    return ranked + [j for j in jobs if j not in ranked]


# --- describing -------------------------------------------------------------------------------------------


def baseline(jobs: list[Job]) -> dict[str, str]:
    """The most common value of each knob (group choices, then every overridden key) over the sweep."""
    keys = [*GROUPS, *sorted({k for j in jobs for k, _ in _override_items(j.overrides) if k not in GROUPS})]
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


def _shown_elsewhere(key: str) -> bool:
    return key in NOT_IN_LABEL or key.startswith("parallelism.")


def describe(job: Job, base: dict[str, str]) -> str:
    """Model and layout, then only the knobs that differ from the sweep's baseline."""
    if not job.config:
        return " ".join(job.overrides)
    deltas = [f"{k}={v}" for k in base if (v := job.knob(k)) is not None and v != base[k] and not _shown_elsewhere(k)]
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


# --- writing ----------------------------------------------------------------------------------------------

CSV_COLUMNS = ["section", "rank", "job", "num", "source", "status", "reason", "description", *GROUPS, "layout",
               "gpus", "tp", "pp", "ep", "mbs", "frozen_vision", "mock_data", "steps", "useful_tokens_per_s_per_gpu",
               "padded_tokens_per_s_per_gpu", "nonpad_fraction", "mfu", "tflops_per_s_per_gpu", "step_s",
               "peak_mem_gib", "memory_gib", "headroom_gib", *TIME_KEYS, *FLOP_KEYS, "first_loss", "last_loss",
               "overrides", "path"]


def csv_row(job: Job, base: dict[str, str]) -> dict[str, Any]:
    lay = job.layout
    return {"section": job.section if job.status == "ok" else "not ranked", "rank": job.rank, "job": job.name,
            "num": job.num, "source": job.source, "status": job.status, "reason": job.reason,
            "description": describe(job, base), **{g: job.choices.get(g) for g in GROUPS},
            "layout": layout_text(job) if job.config else None, "gpus": lay.get("gpus"), "tp": lay.get("tp"),
            "pp": lay.get("pp"), "ep": lay.get("ep"), "mbs": job.mbs, "frozen_vision": job.frozen,
            "mock_data": job.mock, **{k: job.metrics.get(k) for k in CSV_COLUMNS if k in job.metrics},
            "memory_gib": job.memory_gib, "headroom_gib": job.headroom_gib, "overrides": " ".join(job.overrides),
            "path": str(job.path) if job.path else None}


def write_csv(jobs: list[Job], path: Path) -> None:
    base = baseline(jobs)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for job in jobs:
            writer.writerow(csv_row(job, base))


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(_md(c) for c in row) + " |" for row in rows)]


def _percent(x: float | None) -> str:
    return "" if x is None else f"{x:.0%}"


def _headroom(job: Job) -> str:
    h = job.headroom_gib
    return "" if h is None else f"{h:.1f} ({h / job.memory_gib:.0%})"


def ranked_table(jobs: list[Job], base: dict[str, str], kind: str) -> list[str]:
    header = ["rank", "job", "config", "GPUs", "MBS", "useful tok/s/GPU", "non-pad", "MFU", "TFLOP/s/GPU", "step (s)",
              "peak mem (GiB)", "headroom (GiB)", "vision / projector / decoder" + (" time" if kind == "time" else
                                                                                   " FLOPs"), "flags"]
    rows = [[j.rank, j.label, describe(j, base), j.layout.get("gpus", ""), j.mbs or "",
             f"{j.metrics['useful_tokens_per_s_per_gpu']:,.0f}", _percent(j.metrics.get("nonpad_fraction")),
             f"{j.metrics.get('mfu', 0.0):.3%}",
             f"{j.metrics.get('tflops_per_s_per_gpu', 0.0):.2f}", f"{j.metrics['step_s']:.3f}",
             f"{j.metrics['peak_mem_gib']:.1f}", _headroom(j), split_text(j, kind), flags(j)] for j in jobs]
    return _table(header, rows)


def failure_table(jobs: list[Job], base: dict[str, str]) -> list[str]:
    """Why each job is not ranked; steps and throughput show how far it got before failing."""
    rows = [[j.label, STATUS[j.status], j.reason, describe(j, base), j.layout.get("gpus", ""), j.mbs or "",
             j.metrics.get("steps", "" if j.source.startswith("preflight") else 0),
             f"{j.metrics['useful_tokens_per_s_per_gpu']:,.0f}" if j.metrics else "",
             flags(j)] for j in jobs]
    return _table(["job", "status", "reason", "config", "GPUs", "MBS", "steps", "useful tok/s/GPU", "flags"], rows)


def _sweep_line(root: Path | None) -> str | None:
    path = root / "multirun.yaml" if root else None
    if not path or not path.exists():
        return None
    task = ((_load_yaml(path) or {}).get("hydra") or {}).get("overrides", {}).get("task") or []
    return "Sweep overrides: `" + " ".join(task) + "`" if task else None


def render(jobs: list[Job], source: str, root: Path | None) -> str:
    """The markdown report."""
    base, kind = baseline(jobs), split_kind(jobs)
    counts = Counter(STATUS[j.status] for j in jobs)
    fixed = {k: v for k, v in base.items() if all(j.knob(k) == v for j in jobs if j.config)}
    lines = [f"# Sweep report: {Path(source).name or source}", "",
             f"Source: `{source}` · {len(jobs)} job{'s' * (len(jobs) != 1)}: "
             + ", ".join(f"{n} {s}" for s, n in counts.most_common()), "",
             f"Ranked by useful (non-padding) tokens/s/GPU: medians over the steps after the first {SKIP} "
             "(warm-up); non-pad = the share of the tokens the model ran that are not padding. MFU uses "
             "vlmtrain's model FLOPs and the hardware group's dense BF16 peak; peak memory is the "
             "max allocated over ranks; headroom is the hardware group's memory_gib minus that peak."]
    lines += [x for x in (_sweep_line(root),) if x]
    if fixed:
        lines += ["", "Same in every job: " + ", ".join(f"{k}={v}" for k, v in fixed.items()) + "."]
    varying = {k: v for k, v in base.items() if k not in fixed and not _shown_elsewhere(k)}
    if varying:
        lines += ["Baseline of the `config` column (each row lists its model, layout and only what differs): "
                  + ", ".join(f"{k}={v}" for k, v in varying.items()) + "."]
    if kind == "flops":
        lines += ["", "No per-component times in metrics.jsonl: the split columns show the model **FLOP** split, "
                  "not time."]
    for section, title in SECTIONS.items():
        members = [j for j in jobs if j.rank is not None and j.section == section]
        if members:
            lines += ["", f"## {title}", "", *ranked_table(members, base, kind)]
    others = [j for j in jobs if j.rank is None]
    if others:
        lines += ["", "## Not ranked: failures, skips and unfinished runs", "", *failure_table(others, base)]
    lines += ["", "## Plots", "", *(f"![{k}]({name})" for k, name in PLOTS.items()), ""]
    return "\n".join(lines)


# --- plots (matplotlib's object API: no pyplot global state inside a Hydra process) ----------------------

MARKERS = {"main": ("o", "-"), "frozen": ("^", "--"), "mock": ("X", ":")}
SECTION_SHORT = {"main": "trainable vision, real data", "frozen": "frozen vision", "mock": "mock data"}
COMPONENT_COLORS = ("tab:orange", "tab:green", "tab:blue", "tab:purple", "tab:gray", "lightgray")
LABEL_GAP = 0.035
"""Minimum vertical distance between point labels, as a fraction of the y span."""


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _ranked(jobs: list[Job]) -> list[Job]:
    return [j for j in jobs if j.rank is not None]


def _save(fig: Any, path: Path, empty: bool) -> None:
    if empty:
        fig.axes[0].text(0.5, 0.5, "no finished runs to plot", ha="center", va="center",
                         transform=fig.axes[0].transAxes)
    fig.savefig(path)


def _section_note(job: Job) -> str:
    return "" if job.section == "main" else f" [{SECTION_SHORT[job.section]}]"


def _label_points(ax: Any, points: list[tuple[float, float, str]], x_span: float) -> None:
    """Job labels right of their points; in a crowded column they line up right of its rightmost point and move
    up until they no longer overlap, with a leader line."""
    ys = [y for _, y, _ in points]
    gap = LABEL_GAP * ((max(ys) - min(ys)) or max(ys) or 1.0) if ys else 0.0
    columns: dict[int, list[tuple[float, float, str]]] = {}
    for x, y, text in points:
        columns.setdefault(int(x // (0.06 * x_span or 1.0)), []).append((x, y, text))
    for column in columns.values():
        last, right = float("-inf"), max(x for x, _, _ in column)
        for x, y, text in sorted(column, key=lambda p: p[1]):
            last = max(y, last + gap)
            moved = (last, right) != (y, x)
            ax.annotate(f"  {text}", (x, y), xytext=(right, last), textcoords="data", va="center", fontsize=8,
                        arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "gray"} if moved else None)


def plot_throughput_vs_mbs(jobs: list[Job], base: dict[str, str], path: Path) -> None:
    """One line per configuration (model, layout, other knobs) over micro-batch size: is a bigger MBS worth it?"""
    series: dict[str, list[Job]] = {}
    for job in _ranked(jobs):
        key = f"{describe(job, base)} x{job.layout.get('gpus', '?')} GPU{_section_note(job)}"
        series.setdefault(key, []).append(job)
    fig = _figure(12, 6)
    ax = fig.add_subplot()
    ax.set_prop_cycle(color=[f"tab:{c}" for c in ("blue", "orange", "green", "red", "purple", "brown", "pink",
                                                    "gray", "olive", "cyan")] + ["black", "gold", "navy", "lime"])
    points = []
    for label, members in series.items():
        members.sort(key=lambda j: j.mbs or 0)
        marker, style = MARKERS[members[0].section]
        xs = [j.mbs or 0 for j in members]
        ys = [j.metrics["useful_tokens_per_s_per_gpu"] for j in members]
        ax.plot(xs, ys, marker=marker, linestyle=style, label=f"{', '.join(j.short_label for j in members)}: {label}")
        points += [(x, y, j.short_label) for j, x, y in zip(members, xs, ys, strict=True)]
    mbs = sorted({j.mbs or 0 for j in _ranked(jobs)})
    _label_points(ax, points, (max(mbs) - min(mbs)) or 1.0 if mbs else 1.0)
    ax.set_xticks(mbs or [1])
    ax.set_xlabel("micro-batch size (samples per GPU per micro-step)")
    ax.set_ylabel("useful tokens/s/GPU (median after warm-up)")
    ax.set_title("Throughput vs micro-batch size, one line per configuration")
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="job: model layout, changes x GPUs")
    _save(fig, path, not series)


def _split_values(job: Job, kind: str) -> list[float]:
    m = job.metrics
    if kind == "time":
        return [m.get(k, 0.0) for k in TIME_KEYS]
    total = sum(m.get(k, 0.0) for k in FLOP_KEYS) or 1.0
    return [100 * m.get(k, 0.0) / total for k in FLOP_KEYS]


def _bar_total(job: Job, kind: str) -> str:
    if kind == "time":
        return f"  step {job.metrics['step_s']:.3f} s"
    return f"  {sum(job.metrics.get(k, 0.0) for k in FLOP_KEYS) / 1e12:,.1f} TFLOP/step"


def plot_component_split(jobs: list[Job], base: dict[str, str], kind: str, path: Path) -> None:
    """Stacked bars per ranked job: seconds per component when measured, else the share of model FLOPs."""
    ranked = _ranked(jobs)
    fig = _figure(12, 1.6 + 0.4 * max(len(ranked), 1))
    ax = fig.add_subplot()
    ys = list(range(len(ranked)))[::-1]
    left = [0.0] * len(ranked)
    names = COMPONENTS if kind == "time" else COMPONENTS[:3]
    for i, (name, color) in enumerate(zip(names, COMPONENT_COLORS, strict=False)):
        widths = [_split_values(j, kind)[i] for j in ranked]
        ax.barh(ys, widths, left=left, color=color, label=name, height=0.7)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, job, end in zip(ys, ranked, left, strict=True):
        ax.text(end, y, _bar_total(job, kind), va="center", fontsize=8)
    for y, above, below in zip(ys[1:], ranked, ranked[1:], strict=False):
        if above.section != below.section:
            ax.axhline(y + 0.5, color="black", linestyle=":", linewidth=1)
    ax.set_yticks(ys, [f"{j.short_label} {describe(j, base)}{_section_note(j)}" for j in ranked], fontsize=8)
    if kind == "time":
        ax.set_xlabel("time per step (s, median after warm-up)")
        ax.set_xlim(0, max(left + [1e-9]) * 1.25)
        ax.set_title("Step time split by component")
    else:
        ax.set_xlabel("share of model FLOPs per step (%); metrics.jsonl has no per-component times")
        ax.set_xlim(0, 125)
        ax.set_title("Model FLOP split per step (FLOPs, not time)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="component")
    _save(fig, path, not ranked)


def plot_memory_vs_throughput(jobs: list[Job], path: Path) -> None:
    """Peak memory against throughput, with each hardware group's memory as a line: where is headroom left?"""
    from matplotlib.lines import Line2D

    ranked = _ranked(jobs)
    fig = _figure(10, 6)
    ax = fig.add_subplot()
    colors: dict[str, str] = {}
    for job in ranked:
        color = colors.setdefault(job.choices.get("model", "?"), f"C{len(colors) % 10}")
        ax.scatter(job.metrics["peak_mem_gib"], job.metrics["useful_tokens_per_s_per_gpu"],
                   marker=MARKERS[job.section][0], color=color, s=50)
    budgets = sorted({(j.choices.get("hardware", "?"), j.memory_gib) for j in ranked if j.memory_gib},
                     key=lambda b: b[1])
    for hw, mem in budgets:
        ax.axvline(mem, color="red", linestyle="--", linewidth=1)
        ax.text(mem, 1.0, f"{hw}: {mem:.0f} GiB ", color="red", ha="right", va="top", fontsize=8,
                transform=ax.get_xaxis_transform())
    x_max = max([m for _, m in budgets] + [j.metrics["peak_mem_gib"] for j in ranked] + [1.0]) * 1.05
    _label_points(ax, [(j.metrics["peak_mem_gib"], j.metrics["useful_tokens_per_s_per_gpu"], j.short_label)
                       for j in ranked], x_max)
    handles = [Line2D([], [], color=c, marker="o", linestyle="", label=f"model={m}") for m, c in colors.items()]
    handles += [Line2D([], [], color="black", marker=MARKERS[s][0], linestyle="", label=SECTION_SHORT[s])
                for s in SECTIONS if any(j.section == s for j in ranked)]
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="lower right")
    ax.set_xlim(0, x_max)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("peak allocated memory per GPU (GiB, max over ranks)")
    ax.set_ylabel("useful tokens/s/GPU (median after warm-up)")
    ax.set_title("Peak memory vs throughput (red dashed: GPU memory; headroom = distance to it)")
    ax.grid(alpha=0.3)
    _save(fig, path, not ranked)


def write_report(source: str | Path, out: Path | None = None) -> dict[str, Path]:
    """Gather, rank and write report.md, report.csv and the plots; returns their paths."""
    jobs = gather(source)
    root = None if str(source).startswith("wandb:") else Path(source)
    out = Path(out) if out else root or Path(f"report-{str(source).rsplit('/', 1)[-1]}")
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "report.md", "csv": out / "report.csv"}
    paths["md"].write_text(render(jobs, str(source), root))
    write_csv(jobs, paths["csv"])
    base = baseline(jobs)
    paths.update({k: out / name for k, name in PLOTS.items()})
    plot_throughput_vs_mbs(jobs, base, paths["throughput"])
    plot_component_split(jobs, base, split_kind(jobs), paths["split"])
    plot_memory_vs_throughput(jobs, paths["memory"])
    return paths


def safe_write(sweep_dir: str | Path) -> Path | None:
    """write_report that never raises (for Hydra callbacks and sweepers): a warning instead, None on failure."""
    try:
        paths = write_report(Path(str(sweep_dir)))
    except Exception as e:  # noqa: BLE001 - the sweep's results matter more than its report
        print(f"[vlmtrain] WARNING: sweep report failed ({type(e).__name__}: {e}); run `vlmtrain report "
              f"{sweep_dir}` by hand.", file=sys.stderr, flush=True)
        return None
    print(f"[vlmtrain] sweep report: {paths['md']}", flush=True)
    return paths["md"]


class ReportCallback(Callback):
    """Hydra callback: write the sweep report when a multirun ends; a report problem never fails the sweep.

    Hydra calls on_multirun_end only when the sweeper returns: a sweep whose jobs failed raises first (Hydra's
    BasicSweeper, vlmtrain's SweepJobsFailed), so then run `vlmtrain report <sweep dir>` (or call safe_write)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            sweep_dir = config.hydra.sweep.dir
        except Exception as e:  # noqa: BLE001 - same promise for a config without hydra.sweep
            print(f"[vlmtrain] WARNING: sweep report skipped: no hydra.sweep.dir ({e})", file=sys.stderr, flush=True)
            return
        safe_write(sweep_dir)
