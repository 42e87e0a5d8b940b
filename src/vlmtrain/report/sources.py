"""Every job of a sweep: its job directories, W&B runs under it and preflight.json, ranked; or a W&B group."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from vlmtrain.check import refusal
from vlmtrain.config.groups import CHOSEN
from vlmtrain.observe import failure
from vlmtrain.observe.run_summary import read_jsonl
from vlmtrain.report.failures import classify, log_text
from vlmtrain.report.job import Job, steady_metrics, validation_curve
from vlmtrain.report.wandb_runs import attach_wandb, online_jobs

FINDING = re.compile(r"^\[(\w+)\]\s+(\w+):\s*(.*)$", re.DOTALL)


def load_yaml(path: Path) -> Any:
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False) if path.exists() else None


def _job_config(job_dir: Path) -> dict[str, Any]:
    """run_config.yaml (the resolved RunConfig), else Hydra's composed config with its runtime choices."""
    config = load_yaml(job_dir / "run_config.yaml")
    if config:
        return config
    config = load_yaml(job_dir / ".hydra" / "config.yaml") or {}
    hydra = load_yaml(job_dir / ".hydra" / "hydra.yaml") or {}
    choices = ((hydra.get("hydra") or {}).get("runtime") or {}).get("choices") or {}
    if choices and not config.get("choices"):
        config["choices"] = {g: str(v) for g, v in choices.items() if g in CHOSEN and v is not None}
    return config


def _job_num(name: str) -> int | None:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else None


def job_from_dir(job_dir: Path) -> Job:
    """One job from the files its run wrote."""
    rows = read_jsonl(job_dir / "metrics.jsonl")
    checks = _checks(job_dir)
    job = Job(name=job_dir.name, source="files", num=_job_num(job_dir.name), path=job_dir,
              overrides=list(load_yaml(job_dir / ".hydra" / "overrides.yaml") or []), config=_job_config(job_dir),
              metrics=steady_metrics(rows), checks=checks or {}, data_kind=rows[0].get("data_kind") if rows else None,
              validation=validation_curve(rows))
    # MetricsCallback writes the after-training checks into checks.json in on_train_end
    ended = None if checks is None else "frozen_unchanged" in checks
    records = failure.read(job_dir) or [r for r in (refusal.refusal(job_dir),) if r]
    job.status, job.reason = classify(log_text(job_dir), job.metrics.get("steps", 0), job.expected_steps,
                                      dry_run=(job_dir / "bridge_config.yaml").exists(), ended=ended,
                                      record=records[0] if records else None)
    return job


def _checks(job_dir: Path) -> dict[str, Any] | None:
    """checks.json; None when the run wrote none, {} when it is unreadable (cut off mid-write)."""
    path = job_dir / "checks.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _is_job_dir(path: Path) -> bool:
    return path.is_dir() and any((path / f).exists() for f in (".hydra", "run_config.yaml", "metrics.jsonl"))


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The sweep's job directories in job order (or the directory itself when it is one run)."""
    if _is_job_dir(sweep_dir) and not (sweep_dir / "multirun.yaml").exists():
        return [sweep_dir]
    dirs = [d for d in sweep_dir.iterdir() if _is_job_dir(d)]
    return sorted(dirs, key=lambda d: (_job_num(d.name) is None, _job_num(d.name) or 0, d.name))


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
    marked skipped), launched jobs (numbered in list order) that never made a job directory, and, in a
    preflight_only sweep, the jobs that passed and were never meant to."""
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
    for planned, key in ((False, "launched"), (True, "passed")):
        for num, overrides in enumerate(data.get(key, [])):
            if _override_key(list(overrides)) not in by_key:
                new.append(Job(name=" ".join(overrides), source="preflight-launched", num=num,
                               overrides=list(overrides), status="preflight_only" if planned else "incomplete",
                               reason="hydra.sweeper.preflight_only=true: not launched" if planned
                               else "launched, but no job directory was written (never started?)"))
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
    for group in {j.ranking for j in done}:
        ordered = sorted((j for j in done if j.ranking == group),
                         key=lambda j: -j.metrics["useful_tokens_per_s_per_gpu"])
        for i, job in enumerate(ordered, 1):
            job.rank = i
    ranked = sorted(done, key=lambda j: (j.ranking, j.rank))
    return ranked + [j for j in jobs if j not in ranked]
