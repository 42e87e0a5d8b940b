"""A picture of a sweep's W&B workspace, drawn from its saved view spec with matplotlib (object API, as the report's
plots): one row per section, its check text and then each panel as W&B draws it from the same runs (bar charts from
the runs' summaries, line charts from their history), runs grouped by the spec's knobs. What an offline sweep gets
before it is published, and the picture in docs/running.md."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.report.wandb_runs import wandb_run_config
from vlmtrain.report.wandb_sweep import Sweep, flatten

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CELL_IN = (4.2, 3.0)
"""Width and height of one panel in inches."""
TEXT_LINES, TEXT_WIDTH = 16, 58
"""How much of a section's check text its cell shows (lines, characters per line)."""
PALETTE = 64


def group_label(run: dict[str, Any], knobs: list[str]) -> str:
    """The run's knob values (`micro_batch_size=2`), else its name: what W&B's grouping shows for it."""
    flat = flatten(wandb_run_config(run["config"]))
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={flat.get(k)}" for k in knobs) if knobs else str(run["name"])


def groups(sweep: Sweep, knobs: list[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for run in sweep.runs:
        out.setdefault(group_label(run, knobs), []).append(run)
    return dict(sorted(out.items()))


def _text(ax: Any, markdown: str) -> None:
    """The check's prose (tables left out: the workspace shows them in full), wrapped and cut to the cell."""
    prose = [p.replace("**", "").replace("`", "") for p in markdown.split("\n\n") if not p.lstrip().startswith("|")]
    lines = [ln for p in prose for ln in [*textwrap.wrap(p, TEXT_WIDTH), ""]][:TEXT_LINES]
    ax.text(0.0, 1.0, "\n".join(lines), va="top", ha="left", fontsize=7, family="monospace", transform=ax.transAxes)
    ax.set_axis_off()


def _bar(ax: Any, config: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> None:
    """Per group and metric: the mean of the runs' summary values, whiskers at their min and max."""
    metrics = config["metrics"]
    width = 0.8 / len(metrics)
    for i, metric in enumerate(metrics):
        xs, means, spans = [], [], []
        for x, members in enumerate(runs.values()):
            values = [r["summary"][metric] for r in members if isinstance(r["summary"].get(metric), int | float)]
            if values:
                mean = sum(values) / len(values)
                xs.append(x + (i - (len(metrics) - 1) / 2) * width)
                means.append(mean)
                spans.append((mean - min(values), max(values) - mean))
        ax.bar(xs, means, width=width, label=metric, yerr=list(zip(*spans, strict=True)) if spans else None,
               capsize=2)
    ax.set_xticks(range(len(runs)), list(runs), fontsize=7)
    if len(metrics) > 1:
        ax.legend(fontsize=6)


def _line(ax: Any, config: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> None:
    """Every run's history of each metric against `config["xAxis"]`, colored by group, one dash per metric."""
    styles = ("-", "--", ":", "-.")
    for color, (label, members) in enumerate(runs.items()):
        for i, metric in enumerate(config["metrics"]):
            for n, run in enumerate(members):
                points = [(row[config["xAxis"]], row[metric]) for row in run["history"]
                          if isinstance(row.get(metric), int | float)]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, styles[i % len(styles)], color=f"C{color}", marker=".",
                            label=f"{label}: {metric}" if n == 0 else None)
    ax.legend(fontsize=6)


DRAW = {"Bar Chart": _bar, "Run History Line Plot": _line}


def render(sweep: Sweep, spec: dict[str, Any], path: Path) -> Figure:
    """The workspace of `spec` (wandb_views.json's content) drawn from the sweep's runs into a PNG at `path`."""
    from matplotlib.figure import Figure
    from PIL import Image

    sections = spec["workspace"]["spec"]["section"]["panelBankConfig"]["sections"]
    runs = groups(sweep, spec["knobs"])
    cols = max(len(s["panels"]) for s in sections)
    fig = Figure(figsize=(CELL_IN[0] * cols, CELL_IN[1] * len(sections)), dpi=60, layout="constrained")
    fig.suptitle(f"W&B workspace \"{spec['workspace']['displayName']}\", drawn from its view spec")
    grid = fig.add_gridspec(len(sections), cols)
    for row, section in enumerate(sections):
        for col, panel in enumerate(section["panels"]):
            ax = fig.add_subplot(grid[row, col])
            config = panel["config"]
            if panel["viewType"] in DRAW:
                DRAW[panel["viewType"]](ax, config, runs)
                ax.set_title("\n".join(textwrap.wrap(config.get("chartTitle", ""), 48)), fontsize=8)
                ax.set_xlabel(config.get("xAxisTitle", ""), fontsize=7)
                ax.set_ylabel(config.get("yAxisTitle", ""), fontsize=7)
                ax.tick_params(labelsize=7)
                ax.grid(alpha=0.3)
            else:
                _text(ax, config.get("value", ""))
                ax.set_title(section["name"], fontsize=11, loc="left", fontweight="bold")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    buffer.seek(0)
    # 64 colors hold every line, bar and text color: a third of the RGBA file's size
    Image.open(buffer).convert("RGB").quantize(colors=PALETTE).save(path, optimize=True)
    return fig
