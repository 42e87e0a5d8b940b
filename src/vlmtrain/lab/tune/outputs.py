"""What a search leaves: the winner as a preset (conf/experiment/<name>.yaml, starting with its run line), and the
report in the tune dir: report.md (how the invocation ended and what the same command does next, the budget, the
run-to-run spread and the close calls, stage-by-stage gains, finalists, every trial with the spread of its repeats,
what was pruned and why), report.csv (one row per trial) and plots (vlmtrain.report.plots over the trials' run
dirs, and the stage gains)."""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path
from typing import Any

import yaml

from vlmtrain.config.groups import CHOSEN
from vlmtrain.lab.tune import budget, trials
from vlmtrain.lab.tune.budget import gpu_min
from vlmtrain.lab.tune.ledger import FINAL, TRIAL_FLOOR_S, runs_by_name

SKIPPED_KEYS = ("train.iterations", "dry_run", "wandb.group", "hydra.")
"""Overrides of a trial that are not the configuration (the trial's length, its W&B group, launcher settings)."""
STAGE_PLOT = "stage_gains.png"


def preset_tree(overrides: list[str]) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """Group choices (the defaults list) and the nested values of `overrides`, parsed by Hydra's own grammar; a
    later override of a key wins, as on the command line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices: dict[str, str] = {}
    tree: dict[str, Any] = {}
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.key_or_group
        if key.startswith(SKIPPED_KEYS):
            continue
        if key in (*CHOSEN, "experiment"):
            choices[key] = str(o.value())
            continue
        *path, leaf = key.split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = o.value()
    return [{f"override /{g}": c} for g, c in choices.items()], tree


def write_preset(path: Path, overrides: list[str], notes: list[str]) -> Path:
    """conf/experiment/<name>.yaml: `# @package _global_`, its run line, `notes` as comments, then the config."""
    defaults, tree = preset_tree(overrides)
    head = ["# @package _global_", f"# python train.py experiment={path.stem}",
            *(f"# {line}" for n in notes for line in textwrap.wrap(n, 116, break_on_hyphens=False))]
    body = yaml.safe_dump({"defaults": defaults, **tree} if defaults else tree, sort_keys=False,
                          default_flow_style=None, width=118)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(head) + "\n" + body)
    return path


def winner_figure(state: dict[str, Any]) -> tuple[float | None, str]:
    """The winner's useful tokens/s/GPU and what it is: the median of its finalist repeats; where the budget left it
    none, the median of its runs in the comparison, else its one screening run."""
    w, v = state.get("winner") or {}, state.get("versus") or {}
    if w.get("median") is not None:
        return w["median"], f"median of {len(w['repeats'])} finalist repeat(s)"
    if v.get("tune_repeats"):
        return v["tune_useful_tokens_per_s_per_gpu"], (f"median of its {len(v['tune_repeats'])} comparison runs; "
                                                       "no finalist repeat fit the budget")
    return w.get("screen"), ("the median of its stage runs (one, where no close call repeated it); no finalist repeat "
                             "fit the budget")


def _num(x: Any, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def _spread(runs: list[float]) -> str:
    """min-max of a configuration's runs (its repeats), or - for one run."""
    return f"{min(runs):.0f}-{max(runs):.0f} ({len(runs)})" if len(runs) > 1 else "-"


def trial_rows(state: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per trial; `runs`, `runs_min`, `runs_max`: every finished run of its name (its repeats)."""
    rows, runs = [], runs_by_name(state["trials"])
    for tid, t in state["trials"].items():
        o, m, mine = t["outcome"], t["outcome"]["metrics"], runs.get(t["name"], [])
        rows.append({"trial": tid, "stage": t["stage"], "name": t["name"], "iterations": t["iterations"],
                     "repeat": t["repeat"], "status": o["status"], "useful_tokens_per_s_per_gpu":
                     m.get("useful_tokens_per_s_per_gpu"), "mfu": m.get("mfu"), "step_s": m.get("step_s"),
                     "peak_mem_gib": m.get("peak_mem_gib"), "steps": m.get("steps"), "wall_s": o["wall_s"],
                     "startup_s": trials.startup_s(m), "measured_steps_s": m.get("measured_steps_s"),
                     "gpu_s": o["wall_s"] * o["gpus"], "runs": len(mine), "runs_min": min(mine, default=None),
                     "runs_max": max(mine, default=None), "reason": o["reason"],
                     "overrides": " ".join(t["overrides"])})
    return rows


def _stages(state: dict[str, Any]) -> list[str]:
    lines = ["## Stage by stage", "", "| stage | varied | candidates | pruned | ran | best | useful tok/s/GPU before "
             "-> after | gain |", "|---|---|---|---|---|---|---|---|"]
    for s in state["stages"]:
        before, after = s.get("before_useful"), s.get("best_useful")
        gain = f"{after / before:.2f}x" if before and after else "-"
        best = (s.get("best") or s.get("skipped", "-")) + (" (close call)" if s.get("close") else "")
        lines.append(f"| {s['name']} | {', '.join(s['vary'])} | {s.get('candidates', 0)} | {len(s['pruned'])} | "
                     f"{len(s['ran'])} | {best} | {_num(before)} -> {_num(after)} | {gain} |")
    return lines


def _predicted(state: dict[str, Any]) -> list[str]:
    """Each stage's candidates by predicted useful tokens/s/GPU (check.speed), beside what the trial measured."""
    measured = {t["name"]: t["outcome"].get("useful") for t in state["trials"].values()}
    lines = ["## Predicted before running (check.speed), fastest first", "",
             "| stage | # | candidate | predicted s/step | predicted useful tok/s/GPU | predicted MFU | measured |",
             "|---|---|---|---|---|---|---|"]
    for s in state["stages"]:
        for i, p in enumerate(s.get("predicted") or [], 1):
            lines.append(f"| {s['name']} | {i} | {p['name']} | {p['step_s']:.2f} | "
                         f"{p['useful_tokens_per_s_per_gpu']:.0f} | {p['mfu']:.1%} | {_num(measured.get(p['name']))} |")
    return lines


def _pruned(state: dict[str, Any]) -> list[str]:
    lines = ["## Pruned before running (preflight, the memory estimate included)", "", "| stage | candidate | why |",
             "|---|---|---|"]
    for s in state["stages"]:
        for p in s["pruned"]:
            why = "; ".join(f for f in p["findings"] if f.startswith("[error]"))
            lines.append(f"| {s['name']} | {p['name']} | {why.replace('|', '/')} |")
    return lines


def _spend(state: dict[str, Any]) -> list[str]:
    """Where the GPU time went: startup (launcher, rank setup, first step: vlmtrain.observe.startup), the warm-up and
    measured steps, the rest; the median trial's startup against its measured steps."""
    sp = trials.spend(t["outcome"] for t in state["trials"].values())
    total = sum(sp[f"{k.removesuffix('_s')}_gpu_min"] for k in (*trials.PARTS, "other_s"))
    lines = ["## Where the GPU time went", "", "| part | GPU-min | share |", "|---|---|---|"]
    for k in (*trials.PARTS, "other_s"):
        v = sp[f"{k.removesuffix('_s')}_gpu_min"]
        share = _num(v / total if total else None, ".0%")
        lines.append(f"| {k.removesuffix('_s').replace('_', ' ')} | {v:.1f} | {share} |")
    lines += ["", f"Startup (launcher + rank setup + first step): {sp['startup_gpu_min']:.1f} GPU-min "
              f"({_num(sp['startup_share'], '.0%')}), {_num(sp['startup_s_median'])} s in the median trial; measured "
              f"steps {_num(sp['measured_share'], '.0%')}, {_num(sp['measured_steps_s_median'])} s in the median "
              "trial."]
    return lines


def budget_ended(b: dict[str, Any]) -> str:
    """Where the budget ended the stages or the finalists (one of state["budget"]), in words."""
    after = f" after {b['ran']} of its trial(s)" if "ran" in b else ""
    return (f"The budget ended {budget.part(b['stage'])}{after}: {b['why']}; at least {gpu_min(b['least_gpu_s'])} "
            "GPU-min would have run it")


def _budget(state: dict[str, Any]) -> list[str]:
    """Where the budget ended the search, and the least budget its first stage and the finalists needed."""
    lines, least, ended = [], state.get("least_budget"), state.get("budget") or []
    if isinstance(ended, dict):  # a state written before the search named each end: one {stage, why}
        return ["", f"The budget ended {budget.part(ended['stage'])}: {ended['why']}."]
    for b in ended:
        lines += ["", budget_ended(b) + "."]
    if least and (state.get("end") or {}).get("reason") != "too_small":  # that end says it already
        lines += ["", f"Before any trial ran, the first stage ({least['stage']}: at least {least['trials']} of its "
                  f"{least['candidates']} candidates) and the finalists ({least['finalist_trials']} repeats) needed "
                  f"at least {gpu_min(least['gpu_s'])} GPU-min, a trial taken to cost {TRIAL_FLOOR_S:.0f} s of "
                  "start-up x its GPUs (the steps not counted)."]
    return lines


def _close_calls(state: dict[str, Any]) -> list[str]:
    """Decisions between configurations closer than the run-to-run spread, made on the medians of repeats."""
    sp = state.get("spread") or {}
    if sp.get("configs"):
        where = f"the median over {sp['configs']} configuration(s) run more than once"
    else:
        where = "assumed: no configuration has run twice yet"
    lines = ["## Run-to-run spread and close calls", "",
             f"Spread (max - min over the median of one configuration's runs): {sp.get('value', 0):.1%} ({where}). "
             "Configurations closer than the spread are a close call, decided on the medians of their repeats.", ""]
    if not state.get("close"):
        return [*lines, "No close call."]
    lines += ["| stage | decided | configurations: median (min-max of runs) | spread: called at -> after the repeats | "
              "note |", "|---|---|---|---|---|"]
    for c in state["close"]:
        each = "; ".join(f"{n} {_num(m)} ({_spread(r) if len(r) > 1 else 'one run'})"
                         for n, m, r in zip(c["names"], c["medians"], c["runs"], strict=True))
        note = [*(["still within the spread"] if c.get("still_close") else []),
                *([f"repeats cut: {c['cut']}"] if "cut" in c else [])]
        lines.append(f"| {c['stage']} | {c['decided']} | {each} | {c['spread']:.1%} -> {c['spread_after']:.1%} | "
                     f"{'; '.join(note) or '-'} |")
    return lines


def render(state: dict[str, Any], command: str, preset: Path | None) -> str:
    w, v, end = state.get("winner"), state.get("versus"), state.get("end")
    lines = [f"# vlmtrain tune {state['name']}", "", f"`{command}`", "",
             f"Spec `conf/tune/{state['spec']}.yaml`, base `{' '.join(state['base'])}`; {len(state['trials'])} "
             f"trial(s), {state.get('gpu_min', 0):.1f} GPU-min ({_num(state.get('search_gpu_min'), '.1f')} for the "
             "search)."]
    if end:
        lines += ["", f"**Ended**: {end['why']}.", "", f"**Next**: {end['next']}."]
    lines += _budget(state)
    if w:
        useful, what = winner_figure(state)
        close = [c for c in state.get("close") or [] if c["stage"] == FINAL and c["still_close"]]
        lines += ["", f"**Winner**: `{w['name']}`: {_num(useful)} useful tokens/s/GPU, {what} (stage figure "
                  f"{_num(w.get('screen'))})" + (f". Preset `{preset}`" if preset else "") + "."
                  + (" A close call: the finalists' medians are within the run-to-run spread." if close else "")]
    if v:
        lines += ["", f"Against the hand-found configuration on the same machine (A/B pairs): tune "
                  f"{v['tune_useful_tokens_per_s_per_gpu']:.0f} / hand {v['hand_useful_tokens_per_s_per_gpu']:.0f} = "
                  f"**tune_vs_hand {v['tune_vs_hand']:.3f}**."]
    lines += ["", *_close_calls(state), "", *_stages(state), "", "## Finalists", "",
              "| finalist | stage figure | repeats | min-max | median |", "|---|---|---|---|---|"]
    for f in state.get("finalists") or []:
        reps = f.get("repeats") or []
        lines.append(f"| {f['name']} | {_num(f['screen'])} | {', '.join(_num(x) for x in reps)} | {_spread(reps)} | "
                     f"{_num(f.get('median'))} |")
    lines += ["", "## Trials", "", "Runs of one name: its screening run and repeats (min-max, count).", "",
              "| trial | stage | status | useful tok/s/GPU | runs of its name | MFU | step_s | peak GiB | GPU-s | "
              "startup s | measured s | reason |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in trial_rows(state):
        runs = f"{r['runs_min']:.0f}-{r['runs_max']:.0f} ({r['runs']})" if r["runs"] > 1 else "-"
        lines.append(f"| {r['trial']} | {r['stage']} | {r['status']} | {_num(r['useful_tokens_per_s_per_gpu'])} | "
                     f"{runs} | {_num(r['mfu'], '.1%')} | {_num(r['step_s'], '.2f')} | {_num(r['peak_mem_gib'])} | "
                     f"{r['gpu_s']:.0f} | {_num(r['startup_s'])} | {_num(r['measured_steps_s'])} | {r['reason']} |")
    lines += ["", *_spend(state), "", *_predicted(state), "", *_pruned(state), "",
              f"Plots: {STAGE_PLOT}, memory_vs_throughput.png, throughput_vs_mbs.png."]
    return "\n".join(lines) + "\n"


def plot_stages(state: dict[str, Any], path: Path) -> None:
    """The incumbent's useful tokens/s/GPU after each stage that measured something."""
    from matplotlib.figure import Figure

    stages = [s for s in state["stages"] if s.get("best_useful")]
    fig = Figure(figsize=(7, 3.5), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    best, ys = 0.0, []
    for s in stages:
        best = max(best, s["best_useful"])
        ys.append(best)
    ax.bar([s["name"] for s in stages], ys, color="tab:blue")
    ax.set_ylabel("useful tokens/s/GPU (best so far)")
    ax.set_title(f"vlmtrain tune {state['name']}: stage by stage")
    fig.savefig(path)


def write(state: dict[str, Any], out: Path, command: str, preset: Path | None) -> dict[str, Path]:
    """report.md, report.csv and the plots into `out` (the tune dir)."""
    from vlmtrain.report import baseline, job_from_dir, rank
    from vlmtrain.report.plots import PLOTS, plot_memory_vs_throughput, plot_throughput_vs_mbs

    paths = {"md": out / "report.md", "csv": out / "report.csv", "stages": out / STAGE_PLOT}
    paths["md"].write_text(render(state, command, preset))
    rows = trial_rows(state)
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["trial"])
        writer.writeheader()
        writer.writerows(rows)
    plot_stages(state, paths["stages"])
    jobs = []
    for tid, t in state["trials"].items():
        if Path(t["outcome"]["run_dir"]).is_dir():
            jobs.append(job_from_dir(Path(t["outcome"]["run_dir"])))
            jobs[-1].name = tid
    jobs = rank(jobs)
    base = baseline(jobs)
    paths["memory"], paths["throughput"] = out / PLOTS["memory"], out / PLOTS["throughput"]
    plot_memory_vs_throughput(jobs, base, paths["memory"])
    plot_throughput_vs_mbs(jobs, base, paths["throughput"])
    return paths
