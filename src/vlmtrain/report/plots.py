"""The report's PNG plots, drawn with matplotlib's object API: no pyplot global state inside a Hydra process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlmtrain.report.job import COMPONENTS, FLOP_KEYS, SECTIONS, TIME_KEYS, Job
from vlmtrain.report.labels import describe

PLOTS = {"throughput": "throughput_vs_mbs.png", "split": "component_split.png", "memory": "memory_vs_throughput.png"}
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
    ax.set_ylabel("useful tokens/s/GPU (after warm-up)")
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
    ax.set_ylabel("useful tokens/s/GPU (after warm-up)")
    ax.set_title("Peak memory vs throughput (red dashed: GPU memory; headroom = distance to it)")
    ax.grid(alpha=0.3)
    _save(fig, path, not ranked)
