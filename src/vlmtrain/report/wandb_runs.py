"""Jobs from W&B runs: offline record logs under a sweep directory, or a group through the W&B API."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vlmtrain.observe.wandb_run import RUN_CONFIG, reachable
from vlmtrain.report.failures import classify
from vlmtrain.report.job import Job, steady_metrics, validation_curve


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
    """An offline run's .wandb record log as {id, name, entity, group, project, job_type, tags, config, history,
    summary, output, exit_code} (wandb 0.29 has no public reader)."""
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    out: dict[str, Any] = {"id": None, "name": path.stem, "entity": None, "group": None, "project": None,
                           "job_type": None, "tags": [],
                           "config": {}, "history": [], "summary": {}, "output": [], "exit_code": None}
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
        out.update(id=rec.run.run_id, name=rec.run.display_name or rec.run.run_id, entity=rec.run.entity or None,
                   group=rec.run.run_group or None, project=rec.run.project, job_type=rec.run.job_type,
                   tags=list(rec.run.tags))
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
    elif kind == "summary":
        for it in rec.summary.update:
            _merge(out["summary"], *_wandb_item(it))
    elif kind in ("output", "output_raw"):
        out["output"].append(getattr(rec, kind).line)
    elif kind == "exit":
        out["exit_code"] = rec.exit.exit_code


def wandb_run_config(config: dict[str, Any]) -> dict[str, Any]:
    """The run config inside a W&B config: vlmtrain.observe.wandb_run stores {"vlmtrain": run config, "bridge": ...}."""
    inner = config.get(RUN_CONFIG)
    return inner if isinstance(inner, dict) else config


def job_from_wandb(run: dict[str, Any], source: str) -> Job:
    """One job from a W&B run (offline record log or API), classified from its console output and exit."""
    rows = [r for r in run["history"] if "useful_tokens_per_s_per_gpu" in r]
    job = Job(name=run["name"], source=source, config=wandb_run_config(run["config"]), metrics=steady_metrics(rows),
              data_kind=rows[0].get("data_kind") if rows else None, validation=validation_curve(rows))
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


def offline_reason() -> str | None:
    """Why the W&B server cannot be used from here now (None: it can): WANDB_MODE, no API key, no answer."""
    from wandb.apis import InternalApi

    mode = os.environ.get("WANDB_MODE", "")
    if mode in ("offline", "dryrun", "disabled"):
        return f"WANDB_MODE={mode}"
    api = InternalApi()
    if not api.api_key:
        return "no W&B API key (run `wandb login` or set WANDB_API_KEY)"
    if not reachable(api.api_url):
        return f"{api.api_url} is not reachable"
    return None


def online_runs(spec: str) -> list[dict[str, Any]]:
    """Runs of one W&B group through the public API, shaped as read_wandb_file's: spec =
    `<entity>/<project>/<group>` (needs network + key)."""
    import wandb

    path, _, group = spec.rpartition("/")
    entity, _, project = path.rpartition("/")
    runs = []
    for api_run in wandb.Api().runs(path, filters={"group": group}):
        exit_code = {"finished": 0, "crashed": 1, "failed": 1, "killed": 137}.get(api_run.state)
        runs.append({"id": api_run.id, "name": api_run.name, "entity": entity or None, "group": group,
                     "project": project, "job_type": api_run.job_type, "tags": list(api_run.tags),
                     "config": dict(api_run.config), "history": list(api_run.scan_history()),
                     "summary": dict(api_run.summary), "output": [], "exit_code": exit_code})
    return runs


def online_jobs(spec: str) -> list[Job]:
    """The jobs of one W&B group (online_runs)."""
    return [job_from_wandb(run, "wandb") for run in online_runs(spec)]
