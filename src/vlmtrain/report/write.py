"""Writing the report: from `vlmtrain report`, or from Hydra when a multirun ends."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from vlmtrain.report.labels import baseline, split_kind
from vlmtrain.report.plots import (
    PLOTS,
    VALIDATION_PLOT,
    plot_component_split,
    plot_memory_vs_throughput,
    plot_throughput_vs_mbs,
    plot_validation_loss,
)
from vlmtrain.report.sources import gather
from vlmtrain.report.tables import render, write_csv


def write_report(source: str | Path, out: Path | None = None) -> dict[str, Path]:
    """Gather, rank and write report.md, report.csv and the plots (the validation loss plot when a job evaluated
    held-out samples); returns their paths."""
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
    plot_memory_vs_throughput(jobs, base, paths["memory"])
    if any(j.validation for j in jobs):
        paths["validation"] = out / VALIDATION_PLOT
        plot_validation_loss(jobs, base, paths["validation"])
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
    """Hydra callback: write the sweep report when a multirun ends, and its W&B views with `wandb.views=true`
    (report.wandb_views: published only when the sweep logged with wandb.mode=online); a report or views problem
    never fails the sweep.

    conf/train.yaml registers it for every run; only a -m sweep calls on_multirun_end (single runs never do).
    Hydra calls it only when the sweeper returns; vlmtrain's sweeper also calls it before it raises (skipped or
    failed jobs). After a sweep whose sweeper raised first (Hydra's BasicSweeper), run `vlmtrain report <dir>`."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            sweep_dir = config.hydra.sweep.dir
        except Exception as e:  # noqa: BLE001 - same promise for a config without hydra.sweep
            print(f"[vlmtrain] WARNING: sweep report skipped: no hydra.sweep.dir ({e})", file=sys.stderr, flush=True)
            return
        safe_write(sweep_dir)
        if OmegaConf.select(config, "wandb.views", default=False):
            from vlmtrain.report.wandb_views import safe_views

            mode = OmegaConf.select(config, "wandb.mode", default="offline")
            safe_views(sweep_dir, offline=None if mode == "online" else f"wandb.mode={mode}")
