"""The W&B views of a sweep, built with wandb-workspaces from one list of sections: a workspace (a saved view of the
project, its runs filtered to the sweep's group and grouped by the knobs that vary) and a report (each section's
check and tables as text next to the same panels).

Every metric a panel charts is named by vlmtrain.observe.keys, the constants the metrics callback logs with. Bar
charts show each run's W&B summary: the figures `vlmtrain report` ranks by (after warm-up, `report/<key>`), the memory
estimate and the peak memory of the last step; line charts show the history against W&B's step (Bridge's iteration,
metrics.jsonl's step + 1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vlmtrain.observe import keys
from vlmtrain.observe.keys import report_key
from vlmtrain.observe.run_summary import SKIP, TOWERS
from vlmtrain.observe.timing import COMPONENTS, OTHER
from vlmtrain.report import review
from vlmtrain.report.job import STATUS
from vlmtrain.report.wandb_sweep import config_key

if TYPE_CHECKING:
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    from vlmtrain.report.wandb_sweep import Sweep

STEP_AXIS = "iteration (metrics.jsonl step + 1)"
RUNS_AXIS = "runs, grouped by the knobs that vary"
SUMMARY_COLUMNS = (report_key(keys.USEFUL_TOKENS_PER_S_PER_GPU), report_key(keys.MFU), report_key(keys.STEP_S),
                   keys.PEAK_MEM_GIB, keys.MEMORY_ESTIMATE_GIB)
"""Pinned in the workspace's runs table, next to each run's name."""


def _bar(title: str, metrics: list[str], unit: str) -> Any:
    """Each run's (or knob group's: mean, min-max) W&B summary value of `metrics`."""
    import wandb_workspaces.reports.v2 as wr

    return wr.BarPlot(title=title, metrics=metrics, orientation="v", title_x=RUNS_AXIS, title_y=unit,
                      groupby_aggfunc="mean", groupby_rangefunc="minmax")


def _line(title: str, metrics: list[str], unit: str) -> Any:
    """`metrics` against W&B's step, one line per run (or knob group: mean, min-max band)."""
    import wandb_workspaces.reports.v2 as wr

    return wr.LinePlot(title=title, x="Step", y=metrics, title_x=STEP_AXIS, title_y=unit, groupby_aggfunc="mean",
                       groupby_rangefunc="minmax")


def ranking_panels() -> list[Any]:
    return [_bar(f"Useful tokens/s/GPU (after {SKIP} warm-up steps)", [report_key(keys.USEFUL_TOKENS_PER_S_PER_GPU)],
                 "useful tokens/s/GPU"),
            _bar("MFU on useful tokens (fraction of the dense BF16 peak)", [report_key(keys.MFU)], "MFU (0-1)"),
            _line("Useful tokens/s/GPU per step", [keys.USEFUL_TOKENS_PER_S_PER_GPU], "useful tokens/s/GPU")]


def tower_panels() -> list[Any]:
    return [_bar("Tower time per step (s, median after warm-up): vision, projector, decoder",
                 [report_key(k) for k in TOWERS.values()], "seconds per step"),
            _bar("Tower MFU (tower FLOPs / its own time / dense BF16 peak)",
                 [report_key(keys.tower_mfu_key(t)) for t in TOWERS], "MFU (0-1)"),
            _bar("Step time split (s, medians): towers, optimizer, data wait, other",
                 [report_key(keys.time_key(c)) for c in (*COMPONENTS, OTHER)], "seconds per step"),
            _line("Step time (s)", [keys.STEP_S], "seconds per step")]


def memory_panels() -> list[Any]:
    return [_bar("Peak allocated memory (at the last step) vs the memory estimate (GiB per GPU)",
                 [keys.PEAK_MEM_GIB, keys.MEMORY_ESTIMATE_GIB], "GiB per GPU"),
            _line("Peak allocated memory (GiB per GPU, max over ranks)", [keys.PEAK_MEM_GIB], "GiB per GPU")]


def training_panels() -> list[Any]:
    return [_line("lm loss and held-out lm loss (val_lm_loss)", [keys.LM_LOSS, keys.VAL_LM_LOSS],
                  "loss (nats per token)"),
            _line("Grad norm (L2, all ranks)", [keys.GRAD_NORM], "L2 norm"),
            _line("Skipped steps (cumulative; train.on_nonfinite=skip)", [keys.SKIPPED_STEPS], "steps"),
            _line("MoE load-balancing loss (Megatron's auxiliary loss, mean over MoE layers)",
                  [keys.BRIDGE_LOAD_BALANCING_LOSS], "loss")]


@dataclass(frozen=True)
class Section:
    """One section of both views, in the order a performance engineer reads them."""

    name: str
    panels: Callable[[], list[Any]]
    """Fresh panel objects (a workspace and a report each own theirs)."""
    check: Callable[[Sweep], str]
    """What to check and this sweep's verdict (review), as markdown."""


SECTIONS = (
    Section("Ranking", ranking_panels, review.ranking),
    Section("Towers", tower_panels, review.towers),
    Section("Memory", memory_panels, review.memory),
    Section("Training", training_panels, review.training),
    Section("Failures", list, review.failures),
)


def title(sweep: Sweep) -> str:
    return f"vlmtrain sweep {sweep.group}"


def intro(sweep: Sweep) -> str:
    counts = Counter(STATUS[j.status] for j in sweep.jobs)
    grouped = (f"Runs are grouped by what varies: {', '.join(sweep.knobs)} (a group's bar is its runs' mean, the "
               "range their min-max)." if sweep.knobs else "No knob varies between the runs: one bar or line per run.")
    return (f"{len(sweep.runs)} W&B runs of group {sweep.group} in project {sweep.project}; {len(sweep.jobs)} jobs "
            f"({', '.join(f'{n} {s}' for s, n in counts.most_common())}). {grouped} Bar charts show each run's "
            f"summary (after {SKIP} warm-up steps, as `vlmtrain report` ranks it); line charts its steps.")


def group_filter(sweep: Sweep) -> Any:
    """The sweep's runs: those of its W&B group."""
    from wandb_workspaces import expr

    return expr.And(expr.Metric("Group") == sweep.group)


def workspace(sweep: Sweep) -> ws.Workspace:
    """The saved view: the sweep's runs, grouped by its knobs, best first; a check panel opens each section."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    sections = [ws.Section(name=s.name, is_open=True, panels=[wr.MarkdownPanel(markdown=s.check(sweep)), *s.panels()])
                for s in SECTIONS]
    runs = ws.RunsetSettings(filters=group_filter(sweep), groupby=[expr.Config(config_key(k)) for k in sweep.knobs],
                             order=[expr.Ordering(expr.Summary(SUMMARY_COLUMNS[0]), ascending=False)],
                             pinned_columns=[f"summary:{k}" for k in SUMMARY_COLUMNS])
    # W&B draws 10 runs per panel unless told otherwise: a sweep's panels show all of its runs
    return ws.Workspace(entity=sweep.entity or "", project=sweep.project, name=title(sweep), sections=sections,
                        settings=ws.WorkspaceSettings(max_runs=max(len(sweep.runs), 10)), runset_settings=runs)


def report(sweep: Sweep) -> wr.Report:
    """The report: an introduction, then per section its heading, check text and the workspace's panels. Its run
    sets name no project until it is published (naming one looks the project up on the W&B server)."""
    import wandb_workspaces.reports.v2 as wr

    blocks: list[Any] = [wr.P(intro(sweep))]
    for s in SECTIONS:
        blocks += [wr.H2(s.name), wr.MarkdownBlock(text=s.check(sweep))]
        if panels := s.panels():
            runset = wr.Runset(name=sweep.group, filters=group_filter(sweep),
                               groupby=[f"config.{config_key(k)}" for k in sweep.knobs])
            blocks.append(wr.PanelGrid(runsets=[runset], panels=panels))
    return wr.Report(project=sweep.project, entity=sweep.entity or "", title=title(sweep), width="fluid",
                     description=f"Ranking, towers, memory, training and failures of {sweep.source}", blocks=blocks)
