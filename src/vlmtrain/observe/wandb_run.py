"""One W&B run per training run, on the writer rank (the last rank, where Bridge logs too), owned by vlmtrain.

- Identity: project/entity/mode from `run.wandb`; group = `run.wandb.group` (flow.py fills in the sweep directory's
  name for -m sweeps) else the run name; job_type; tags for every group choice (`parallelism:fsdp`), the model,
  the data kind (`data:mock` + `data_kind:mock` on mock data) and the library versions.
- Config: {"vlmtrain": the composed run config, "bridge": Bridge's resolved ConfigContainer}, JSON-sanitized the
  way Bridge does it, secrets masked (vlmtrain.config.redact).
- Mode: WANDB_MODE in the environment wins over `run.wandb.mode`. Online first probes the W&B server (an HTTP
  HEAD with a 2 s limit, DNS and proxy included): no answer -> offline at once, with the `wandb sync` command
  printed (wandb.init itself would stall ~100 s without network, ~55 s against a host that never answers). An
  online init that still fails (no API key, rejected key, init timeout) also falls back to offline.
- Bridge: `logger.wandb_project` stays unset so Bridge never calls wandb.init itself; our run is handed to
  Bridge's GlobalState (`_wandb_logger`, the lazily-built attribute its `wandb_logger` property returns), so
  Bridge's own metrics (lm loss, learning-rate, grad-norm, load_balancing_loss, timers, throughput when enabled)
  land in the same run under their own names, at Bridge's iteration number.
- Rows: each metrics.jsonl row is logged at W&B step = row["step"] + 1, Bridge's iteration number for that step,
  so vlmtrain's and Bridge's numbers for one step share a history row; a row an evaluation followed
  (train.eval_interval) carries `val_lm_loss`, next to Bridge's own `lm loss validation` at the same step. Bridge
  finishes the run in _finish_train.
- Summary: at start the memory estimate (`memory_estimate_gib`, the allocator peak check.memory predicts: a run that
  runs out of memory still has it); at train end the after-training checks and the run's figures as
  `vlmtrain report` computes them under `report/<key>` (observe.run_summary over metrics.jsonl: rates over the
  steps after warm-up, medians of the step and component times, per-tower MFU), so a W&B bar chart or runs table
  shows the number the report ranks by rather than the last step's.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.config import redact
from vlmtrain.observe import keys
from vlmtrain.observe.run_summary import SUMMARY_KEYS, summarize_rows
from vlmtrain.train.after_build import SettingNotApplied

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

DEFAULT_BASE_URL = "https://api.wandb.ai"
PROBE_TIMEOUT_S = 2.0
VERSIONED = ("megatron-bridge", "megatron-core", "transformer-engine", "torch")
MAX_TAG_LEN = 64
RUN_CONFIG = "vlmtrain"
"""The W&B config key of the composed run config (next to "bridge", Bridge's resolved ConfigContainer)."""


def note(message: str) -> None:
    print(f"[vlmtrain] W&B: {message}", flush=True)


def sweep_group(sweep_dir: str) -> str:
    """W&B group of a -m sweep: its directory, e.g. multirun/2026-11-29/22-26-58 -> 2026-11-29_22-26-58."""
    parts = [p for p in Path(sweep_dir).parts[-2:] if p not in ("multirun", os.sep)]
    return "_".join(parts) or str(sweep_dir)


def group(run: RunConfig) -> str:
    return run.wandb.group or run.name


def display_name(run: RunConfig) -> str:
    """The run name plus its directory (a sweep job's dir names its overrides)."""
    return f"{run.name}-{Path(run.output_dir).name}"


def versions() -> dict[str, str]:
    out = {}
    for dist in VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def tags(run: RunConfig) -> list[str]:
    """Every group choice, the model, the data kind (mock is unmissable), library versions, extra tags."""
    kind = str(run.data.kind)
    found = [f"{g}:{c}" for g, c in run.choices.items()]
    found += [f"model:{run.model.name}", f"data:{kind}", f"data_kind:{'mock' if kind == 'mock' else 'real'}"]
    found += [f"{dist}:{v}" for dist, v in versions().items()]
    found += list(run.wandb.tags)
    return list(dict.fromkeys(t[:MAX_TAG_LEN] for t in found))


def config(run: RunConfig, bridge_cfg: ConfigContainer | None) -> dict[str, Any]:
    """The composed vlmtrain config and Bridge's resolved fields, JSON-sanitized like Bridge's own, secrets masked."""
    from omegaconf import OmegaConf

    tree: dict[str, Any] = {RUN_CONFIG: OmegaConf.to_container(OmegaConf.structured(run), enum_to_str=True)}
    if bridge_cfg is not None:
        from megatron.bridge.training.utils.log_utils import safe_serialize

        tree["bridge"] = json.loads(json.dumps(bridge_cfg.to_dict(), default=safe_serialize))
    return redact.redact(tree)


def reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the W&B server answers HTTP within `timeout` (any status; DNS, TLS and the environment's proxy
    included): a dead network or a host that accepts but never answers both say no."""
    answered: list[bool] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
            answered.append(True)
        except urllib.error.HTTPError:
            answered.append(True)
        except urllib.error.URLError as e:  # a TLS error means the host answered; wandb may trust other CAs
            answered.append(isinstance(e.reason, ssl.SSLError))
        except (OSError, ValueError):
            answered.append(False)

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(answered and answered[0])


def requested_mode(run: RunConfig, environ: Mapping[str, str] = os.environ) -> str:
    """online | offline | disabled: wandb.enabled=false is off; WANDB_MODE wins over run.wandb.mode."""
    if not run.wandb.enabled:
        return "disabled"
    mode = environ.get("WANDB_MODE") or run.wandb.mode
    return "offline" if mode == "dryrun" else mode


def go_offline(reason: str) -> None:
    os.environ["WANDB_MODE"] = "offline"
    note(f"{reason}: logging offline (WANDB_MODE=offline).")


def init(run: RunConfig, bridge_cfg: ConfigContainer | None, res: Resolved | None = None) -> Any | None:
    """Start this training run's W&B run (writer rank only), with the memory estimate in its summary when `res` is
    given; None when W&B is off."""
    mode = requested_mode(run)
    if mode == "disabled":
        return None
    url = os.environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL
    if mode == "online" and not reachable(url):
        go_offline(f"{url} is not reachable")
        mode = "offline"
    import wandb

    kwargs = {"project": run.wandb.project, "entity": run.wandb.entity, "group": group(run),
              "job_type": run.wandb.job_type, "tags": tags(run), "name": display_name(run),
              "dir": str(Path(run.output_dir).resolve()), "config": config(run, bridge_cfg),
              "settings": wandb.Settings(init_timeout=run.wandb.init_timeout_s)}
    Path(kwargs["dir"]).mkdir(parents=True, exist_ok=True)
    wb_run = None
    if mode == "online":
        try:
            wb_run = wandb.init(mode="online", **kwargs)
        except Exception as e:  # wandb raises UsageError, CommError, AuthenticationError, ... training goes on
            go_offline(f"online init failed ({type(e).__name__}: {e})")
    if wb_run is None:
        wb_run = wandb.init(mode="offline", **kwargs)
        note(f"offline run in {wb_run.settings.sync_dir}; upload later with: wandb sync {wb_run.settings.sync_dir}")
    if res is not None:
        from vlmtrain.check import memory

        wb_run.summary[keys.MEMORY_ESTIMATE_GIB] = memory.estimate(run, res).allocated
    return wb_run


def hand_to_bridge(state: Any, wb_run: Any | None) -> None:
    """Make Bridge log into our run: its `wandb_logger` property returns `_wandb_logger` once set (the wandb
    module, whose log() writes to the active run), and never calls wandb.init itself while logger.wandb_project
    is unset."""
    if state.cfg.logger.wandb_project:
        raise SettingNotApplied("Bridge's logger.wandb_project is set, so Bridge opened its own W&B run; "
                                "configure W&B through wandb.* instead of +bridge.logger.wandb_*.")
    if wb_run is not None and not getattr(wb_run, "disabled", False):
        import wandb

        state._wandb_logger = wandb


def check_bridge_logger(run: RunConfig) -> None:
    """Before training: refuse +bridge.logger.wandb_project (a second W&B run, ours would join it untagged)."""
    logger = (run.bridge or {}).get("logger") or {}
    if logger.get("wandb_project"):
        raise SettingNotApplied("+bridge.logger.wandb_project would make Bridge open its own W&B run; "
                                "use wandb.project (and wandb.entity/group/tags) instead.")


def log_row(wb_run: Any | None, row: dict[str, Any]) -> None:
    """One metrics.jsonl row, at Bridge's iteration number of that step (row["step"] + 1)."""
    if wb_run is not None:
        wb_run.log(row, step=int(row["step"]) + 1)


def summarize(wb_run: Any | None, checks: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """At train end: the after-training checks and the figures of the run's metrics.jsonl `rows` into the summary,
    and the sync command when offline. Bridge's _finish_train finishes the run (it holds it), after any
    post-training evaluation has logged into it."""
    if wb_run is None:
        return
    figures = summarize_rows(rows, keys=SUMMARY_KEYS)
    wb_run.summary.update({"checks": checks, **{keys.report_key(k): v for k, v in figures.items()}})
    if wb_run.offline:
        note(f"upload this run with: wandb sync {wb_run.settings.sync_dir}")


def finish(wb_run: Any | None) -> None:
    """Close the run where Bridge does not (a run never handed to Bridge)."""
    if wb_run is not None:
        wb_run.finish()
