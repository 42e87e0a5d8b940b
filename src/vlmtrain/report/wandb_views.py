"""`vlmtrain wandb views <sweep dir | wandb:<entity>/<project>/<group>>`: the sweep's W&B workspace and report.

Both are built without network (report.wandb_panels) and written, with a picture of the workspace
(report.wandb_preview), as their W&B view specs to `wandb_views.json` next to the sweep. Online (a W&B API key and a
server that answers) they are then published: the sweep's offline runs are uploaded (`wandb sync`, runs already
synced are skipped), the workspace and report saved, and their URLs printed and kept in the file, so publishing again
updates the same views. Offline, it prints the one command that publishes them later:

    vlmtrain wandb publish <dir>/wandb_views.json [--entity E]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from vlmtrain.report import wandb_panels, wandb_preview
from vlmtrain.report.wandb_runs import offline_reason
from vlmtrain.report.wandb_sweep import Sweep, SweepError, read

SPEC_FILE = "wandb_views.json"
PREVIEW_FILE = "wandb_views.png"


class PublishError(RuntimeError):
    """The views cannot be published now; the message says why and what to do, the spec file stays."""


def _dump(model: Any) -> dict[str, Any]:
    """A wandb-workspaces view model as the JSON W&B stores (its spec). The library (0.4.13) has no public
    serialization: `_to_model`/`_from_model`, used here and in load(), are what its own save() and from_url() use."""
    return json.loads(model.model_dump_json(by_alias=True, exclude_none=True))


def spec(sweep: Sweep, folder: Path) -> dict[str, Any]:
    """The workspace's and the report's view specs and what publishing them needs: the sweep's W&B identity and its
    offline runs to upload, relative to `folder` (where the spec is written)."""
    return {"source": sweep.source, "entity": sweep.entity, "project": sweep.project, "group": sweep.group,
            "knobs": sweep.knobs, "offline_runs": [os.path.relpath(p, folder) for p in sweep.offline_runs()],
            "workspace": _dump(wandb_panels.workspace(sweep)._to_model()),
            "report": _dump(wandb_panels.report(sweep)._to_model())}


def out_dir(sweep: Sweep, out: Path | None) -> Path:
    """--out, else the sweep dir, else report-<group> (as `vlmtrain report` does for a W&B group)."""
    return Path(out) if out else sweep.root or Path(f"report-{sweep.group}")


def write(sweep: Sweep, out: Path | None = None) -> Path:
    """wandb_views.json and wandb_views.png; returns the JSON's path."""
    folder = out_dir(sweep, out)
    folder.mkdir(parents=True, exist_ok=True)
    data = spec(sweep, folder)
    path = folder / SPEC_FILE
    path.write_text(json.dumps(data, indent=1) + "\n")
    wandb_preview.render(sweep, data, folder / PREVIEW_FILE)
    return path


def load(data: dict[str, Any], entity: str) -> tuple[Any, Any]:
    """The workspace and report of a spec, for `entity`, with the report's run sets pointed at the sweep's project
    (which looks the project up on the W&B server when the report is saved)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces.reports.v2 import internal as report_model
    from wandb_workspaces.workspaces import internal as view_model

    view = ws.Workspace._from_model(view_model.View.model_validate(data["workspace"]))
    view.entity = entity
    doc = wr.Report._from_model(report_model.ReportViewspec.model_validate(data["report"]))
    doc.entity = entity
    for block in doc.blocks:
        for runset in getattr(block, "runsets", []):
            runset.entity, runset.project = entity, data["project"]
    return view, doc


def _sync(data: dict[str, Any], folder: Path, entity: str) -> None:
    """Upload the sweep's offline runs not yet synced (wandb marks a synced one with `<record>.synced`); listed
    relative to the spec's folder, so a sweep dir moved with its spec still finds them."""
    runs = [folder / d for d in data["offline_runs"]]
    for missing in (d for d in runs if not d.is_dir()):
        print(f"[vlmtrain] WARNING: {missing}: no such run directory, not uploaded", file=sys.stderr, flush=True)
    todo = [str(d) for d in runs if d.is_dir() and not all(Path(f"{r}.synced").exists() for r in d.glob("run-*.wandb"))]
    if not todo:
        return
    command = [sys.executable, "-m", "wandb", "sync", "--entity", entity, "--project", data["project"], *todo]
    if subprocess.run(command, check=False).returncode != 0:
        raise PublishError(f"uploading the sweep's offline runs failed: {' '.join(command)}")


def publish(path: Path, entity: str | None = None) -> dict[str, str]:
    """Upload the sweep's offline runs, save the workspace and the report; their URLs, also kept in the file."""
    if reason := offline_reason():
        raise PublishError(f"cannot publish now: {reason}. The views stay in {path}.")
    import wandb

    data = json.loads(Path(path).read_text())
    entity = entity or data["entity"] or wandb.Api().default_entity
    _sync(data, Path(path).parent, entity)
    view, doc = load(data, entity)
    try:
        view.save()
        doc.save()
    except Exception as e:  # wandb's CommError, a GraphQL refusal (entity, project, permission): say which
        raise PublishError(f"W&B did not save the views ({type(e).__name__}: {e}); they stay in {path}") from e
    data.update(entity=entity, workspace=_dump(view._to_model()), report=_dump(doc._to_model()),
                urls={"workspace": view.url, "report": doc.url})
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
    return data["urls"]


def publish_command(path: Path) -> str:
    return f"vlmtrain wandb publish {path}"


def views(source: str | Path, out: Path | None = None, entity: str | None = None, offline: str | None = None) -> int:
    """Build, write and publish the views unless `offline` says why not or offline_reason() finds a reason; prints
    what it did. Exit status 2 on a source it cannot read."""
    try:
        sweep = read(source)
    except SweepError as e:
        print(f"vlmtrain wandb views: {e}", file=sys.stderr)
        return 2
    sweep.entity = entity or sweep.entity  # kept in the spec: publishing later goes to the same entity
    path = write(sweep, out)
    print(f"[vlmtrain] W&B views: {path} (picture: {path.with_name(PREVIEW_FILE)})", flush=True)
    reason = offline or offline_reason()
    if reason:
        print(f"[vlmtrain] not published ({reason}); publish them later with:\n  {publish_command(path)}", flush=True)
        return 0
    return publish_main(path)


def publish_main(path: Path, entity: str | None = None) -> int:
    """`vlmtrain wandb publish`: exit 2 with the reason when it cannot publish now (nothing is lost)."""
    if not Path(path).is_file():
        print(f"vlmtrain wandb publish: {path}: no such file (`vlmtrain wandb views <sweep>` writes it)",
              file=sys.stderr)
        return 2
    try:
        urls = publish(Path(path), entity)
    except PublishError as e:
        print(f"vlmtrain wandb publish: {e}", file=sys.stderr)
        return 2
    print(f"[vlmtrain] W&B workspace: {urls['workspace']}\n[vlmtrain] W&B report: {urls['report']}", flush=True)
    return 0


def safe_views(sweep_dir: str | Path, offline: str | None = None) -> None:
    """views() that never raises (the end of a sweep): a warning with the command to run instead."""
    try:
        views(sweep_dir, offline=offline)
    except Exception as e:  # noqa: BLE001 - the sweep's results matter more than its dashboard
        print(f"[vlmtrain] WARNING: W&B views failed ({type(e).__name__}: {e}); run `vlmtrain wandb views "
              f"{sweep_dir}` by hand.", file=sys.stderr, flush=True)
