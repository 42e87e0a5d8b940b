"""The report's PNG plots, drawn with matplotlib's object API: no pyplot global state inside a Hydra process."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.observe.run_summary import FLOP_KEYS, TIME_KEYS
from vlmtrain.report.job import COMPONENTS, SECTIONS, Job
from vlmtrain.report.labels import baseline_note, distinct_labels, facets

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOTS = {"throughput": "throughput_vs_mbs.png", "split": "component_split.png", "memory": "memory_vs_throughput.png"}
VALIDATION_PLOT = "validation_loss.png"
"""Drawn (and listed in report.md) only when a job evaluated held-out samples."""
MARKERS = {"main": ("o", "-"), "frozen": ("^", "--"), "mock": ("X", ":")}
SECTION_SHORT = {"main": "trainable vision, real data", "frozen": "frozen vision", "mock": "mock data"}
COMPONENT_COLORS = ("tab:orange", "tab:green", "tab:blue", "tab:purple", "tab:gray", "lightgray")
LABEL_GAP = 0.035
"""Minimum vertical distance between point labels, as a fraction of the y span."""
CHAR_IN, AXES_SHARE = 0.6 * 8 / 72, 0.8
"""Estimated width of one 8 pt label character (inches), and the share of the figure's width its axes take."""
DODGE = 0.3
"""Horizontal spread of the throughput plot's series around each MBS column (1.0 = the distance between columns)."""


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _ranked(jobs: list[Job]) -> list[Job]:
    return [j for j in jobs if j.rank is not None]


def _save(fig: Any, path: Path, empty: bool) -> None:
    if empty:
        fig.axes[0].text(0.5, 0.5, "no finished training run to plot\n(report.md lists the dry runs, skips and "
                         "failures)", ha="center", va="center", transform=fig.axes[0].transAxes)
    fig.savefig(path)


def _title(ax: Any, title: str, note: str) -> None:
    """The title, and under it the baseline the labels leave out (across the figure: it can be long)."""
    ax.figure.suptitle("\n".join([title, *textwrap.wrap(note, 160)]), fontsize=10)


def _section_handles(jobs: list[Job]) -> list[Any]:
    """Legend entries for the markers of the sections present (frozen vision, mock data)."""
    from matplotlib.lines import Line2D

    return [Line2D([], [], color="black", marker=MARKERS[s][0], linestyle="", label=SECTION_SHORT[s])
            for s in SECTIONS if any(j.section == s for j in jobs)]


def _label_points(ax: Any, points: list[tuple[float, float, str]]) -> None:
    """Job labels right of their points, each moved up or down (with a leader line) until it covers no point and
    no label placed before it. Text widths are estimated from the axes' x span: call after set_xlim."""
    if not points:
        return
    ys = [y for _, y, _ in points]
    gap = LABEL_GAP * ((max(ys) - min(ys)) or max(ys) or 1.0)
    x0, x1 = ax.get_xlim()
    char = (x1 - x0) * CHAR_IN / (AXES_SHARE * ax.figure.get_figwidth())
    steps = [0, *(sign * k for k in range(1, 2 * len(points) + 1) for sign in (1, -1))]
    placed = [(x - char, x + char, y) for x, y, _ in points]  # the markers
    for x, y, text in sorted(points, key=lambda p: (p[1], p[0])):
        start, end = x + char, x + (len(text) + 4) * char
        at = next((y + k * gap for k in steps if not any(abs(y + k * gap - py) < gap and start < pe and ps < end
                                                          for ps, pe, py in placed)), y)
        placed.append((start, end, at))
        moved = at != y
        ax.annotate(f"  {text}", (x, y), xytext=(x + 2 * char if moved else x, at), textcoords="data", va="center",
                    fontsize=8, arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "gray"} if moved else None)


def mbs_series(jobs: list[Job], base: dict[str, str]) -> list[list[Job]]:
    """Ranked jobs grouped by everything but MBS (model, layout, GPUs, every other knob, section), so one line never
    joins two models or layouts; a job without a config is a series of its own."""
    groups: dict[tuple[str, ...], list[Job]] = {}
    for job in _ranked(jobs):
        key = (job.section, *facets(job, base, mbs=False).values())
        groups.setdefault(key, []).append(job)
    return list(groups.values())


def plot_throughput_vs_mbs(jobs: list[Job], base: dict[str, str], path: Path) -> Figure:
    """One line per configuration over micro-batch size (is a bigger MBS worth it?), each labelled with what
    differs between the lines. MBS is a category axis (1, 2, 4, 8 evenly spaced), and a job whose MBS is unknown
    goes to an "MBS unknown" column instead of 0; series are spread a little around each column."""
    series = mbs_series(jobs, base)
    known = sorted({j.mbs for s in series for j in s if j.mbs is not None})
    unknown = any(j.mbs is None for s in series for j in s)
    column = {m: i for i, m in enumerate(known)}
    fig = _figure(13, 6.5)
    ax = fig.add_subplot()
    ax.set_prop_cycle(color=[f"tab:{c}" for c in ("blue", "orange", "green", "red", "purple", "brown", "pink",
                                                    "gray", "olive", "cyan")] + ["black", "gold", "navy", "lime"])
    labels = distinct_labels([s[0] for s in series], base, mbs=False)
    points = []
    for i, (members, label) in enumerate(zip(series, labels, strict=True)):
        members.sort(key=lambda j: (j.mbs is None, j.mbs or 0))
        marker, style = MARKERS[members[0].section]
        dodge = DODGE * (i / (len(series) - 1) - 0.5) if len(series) > 1 else 0.0  # same MBS, same y: still apart
        xs = [dodge + (column[j.mbs] if j.mbs is not None else len(known)) for j in members]
        ys = [j.metrics["useful_tokens_per_s_per_gpu"] for j in members]
        n = sum(j.mbs is not None for j in members)  # members sort known MBS first: no line into "unknown"
        (line,) = ax.plot(xs[:n], ys[:n], marker=marker, linestyle=style)
        ax.plot(xs[n:], ys[n:], marker=marker, linestyle="", color=line.get_color())
        points.append((xs[-1], ys[-1], f"{label}{_numbers(members)}"))
    ticks = [f"MBS {m}" for m in known] + (["MBS unknown"] if unknown else [])
    ax.set_xticks(range(len(ticks)), ticks)
    ax.set_xlim(-0.3, len(ticks) - 0.3 + 0.7 * max(len(ticks), 1))  # room for the labels right of the last column
    _label_points(ax, points)
    ax.set_xlabel("micro-batch size (samples per GPU per micro-step)")
    ax.set_ylabel("useful tokens/s/GPU (after warm-up)")
    _title(ax, "Throughput vs micro-batch size, one line per configuration (labels: what differs)",
           baseline_note([s[0] for s in series], base))
    ax.grid(alpha=0.3)
    if len(handles := _section_handles([s[0] for s in series])) > 1:
        ax.legend(handles=handles, fontsize=8, loc="lower right")
    _save(fig, path, not series)
    return fig


def _numbers(members: list[Job]) -> str:
    """The members' job numbers (the tables' job column), when they have them."""
    nums = [f"#{j.num}" for j in members if j.num is not None]
    return f"  ({', '.join(nums)})" if nums else ""


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


def plot_component_split(jobs: list[Job], base: dict[str, str], kind: str, path: Path) -> Figure:
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
    ticks = [f"{label}{_numbers([j])}" for j, label in zip(ranked, distinct_labels(ranked, base), strict=True)]
    ax.set_yticks(ys, ticks, fontsize=8)
    if kind == "time":
        ax.set_xlabel("time per step (s, median after warm-up)")
        ax.set_xlim(0, max(left + [1e-9]) * 1.25)
        _title(ax, "Step time split by component", baseline_note(ranked, base))
    else:
        ax.set_xlabel("share of model FLOPs per step (%); metrics.jsonl has no per-component times")
        ax.set_xlim(0, 125)
        _title(ax, "Model FLOP split per step (FLOPs, not time)", baseline_note(ranked, base))
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="component")
    _save(fig, path, not ranked)
    return fig


def plot_memory_vs_throughput(jobs: list[Job], base: dict[str, str], path: Path) -> Figure:
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
    handles = [Line2D([], [], color=c, marker="o", linestyle="", label=f"model={m}" if m != "?" else "model unknown")
               for m, c in colors.items()]
    handles += _section_handles(ranked)
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="lower right")
    ax.set_xlim(0, x_max)
    ax.set_ylim(bottom=0)
    _label_points(ax, [(j.metrics["peak_mem_gib"], j.metrics["useful_tokens_per_s_per_gpu"], f"{label}{_numbers([j])}")
                       for j, label in zip(ranked, distinct_labels(ranked, base), strict=True)])
    ax.set_xlabel("peak allocated memory per GPU (GiB, max over ranks)")
    ax.set_ylabel("useful tokens/s/GPU (after warm-up)")
    _title(ax, "Peak memory vs throughput (red dashed: GPU memory; headroom = distance to it)",
           baseline_note(ranked, base))
    ax.grid(alpha=0.3)
    _save(fig, path, not ranked)
    return fig


def plot_validation_loss(jobs: list[Job], base: dict[str, str], path: Path) -> Figure:
    """Validation loss against step, one line per job that evaluated held-out samples (failed ones included: the
    loss up to the failure still says how training went), each labelled with what differs between them."""
    shown = [j for j in jobs if j.validation]
    fig = _figure(11, 6)
    ax = fig.add_subplot()
    for job, label in zip(shown, distinct_labels(shown, base), strict=True):
        steps, losses = zip(*job.validation, strict=True)
        ax.plot(steps, losses, marker="o", linestyle=MARKERS[job.section][1], label=f"{label}{_numbers([job])}")
    ax.set_xlabel("step (metrics.jsonl numbering)")
    ax.set_ylabel("validation loss (val_lm_loss)")
    _title(ax, "Validation loss vs step (held-out samples, every train.eval_interval steps)",
           baseline_note(shown, base))
    ax.grid(alpha=0.3)
    if shown:
        ax.legend(fontsize=8, loc="upper right")
    else:
        ax.text(0.5, 0.5, "no job evaluated held-out samples (train.eval_interval)", ha="center", va="center",
                transform=ax.transAxes)
    fig.savefig(path)
    return fig
