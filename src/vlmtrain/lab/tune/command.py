"""`vlmtrain tune`: compose the base, run the staged search (vlmtrain.lab.tune.search) in the tune dir, write the winner
as a preset and the report; `--results` appends the search's row (winner, GPU minutes, tune_vs_hand, where the GPU
time went). The hand side of the comparison is, unless `--versus` names one, the shipped preset of the base's model,
data, hardware and world (never one a search wrote). Every trial caches its data scan, processor, bins and compiled
kernels in one dir (`--cache-dir`, default `<tune dir>/cache`), which travels with the search's state. Every
invocation prints why it stopped and what the same command does next.

Exit status: 0 done (the winner's preset written; also a re-run with nothing left to do, or --plan), 1 no trial
finished, 2 a bad command line or spec, 3 paused at --max-wall-min (the same command resumes), 4 the same command
cannot go on (--plan too): the budget cannot hold the first stage and the finalists (nothing ran), or the next trial
is longer than --max-wall-min; the message names the least --budget-gpu-min or --max-wall-min that would."""

from __future__ import annotations

import argparse
import hashlib
import shlex
import sys
from pathlib import Path
from typing import Any

from vlmtrain.config.compose import CONF_DIR
from vlmtrain.lab.kit import experiments, store
from vlmtrain.lab.kit.case import placed_resolved

PAUSED = 3
"""Exit status of an invocation that hit --max-wall-min: run the same command again to resume."""
FOUND_BY = "Found by `vlmtrain tune"
"""How the notes of a preset a search wrote begin: such a preset is never the default hand side."""
BLOCKED = 4
"""Exit status where the same command would run nothing: a larger --budget-gpu-min or --max-wall-min is needed."""
EXIT = {"wall": PAUSED, "wall_short": BLOCKED, "too_small": BLOCKED, "plan": 0}
"""Exit status by why the search stopped (tune.budget.end); done: 0 with a winner, else 1."""


def split(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the configuration, the launcher's settings): hydra/launcher=slurm and hydra.* go to every trial, not into
    the preset."""
    launcher = [o for o in overrides if o.lstrip("+").startswith(("hydra/", "hydra."))]
    return [o for o in overrides if o not in launcher], launcher


def default_name(base: list[str]) -> str:
    return "tune_" + hashlib.sha1(" ".join(base).encode()).hexdigest()[:8]


def shipped_preset(base: list[str], node_gpus: int) -> str | None:
    """The one shipped preset (conf/experiment/, not written by a search) whose model, data, hardware and world
    (space.problem) are the base's; None where none or several are."""
    from vlmtrain.lab.tune import space

    want = space.problem(base, node_gpus)
    found = [p.stem for p in sorted((CONF_DIR / "experiment").glob("*.yaml")) if FOUND_BY not in p.read_text()
             and space.problem([f"experiment={p.stem}"], node_gpus) == want]
    return found[0] if len(found) == 1 else None


def hand_side(versus: str | None, base: list[str], name: str, node_gpus: int) -> list[str] | None:
    """The comparison's hand-found overrides: `--versus` (none: no comparison), else the base's shipped preset."""
    if versus is not None:
        hand = [] if versus == "none" else shlex.split(versus)
        if f"experiment={name}" in hand:
            raise ValueError(f"--versus experiment={name} is the preset this search writes: its own winner, not a "
                             "hand-found configuration")
        return hand or None
    preset = shipped_preset(base, node_gpus)
    return [f"experiment={preset}"] if preset else None


def cache_overrides(base: list[str], cache_dir: Path) -> list[str]:
    """Every trial's data.cache_dir (its data scan, processor, lengths, bins and, through kernels.cache_root, its
    compiled kernels): one dir for the whole search, so only its first trial pays for them, and a resume on a fresh
    machine that has the tune dir starts warm; none where the base sets data.cache_dir."""
    if any(o.startswith("data.cache_dir=") for o in base):
        return []
    return [f"data.cache_dir={cache_dir.expanduser().absolute()}"]


def result_row(state: dict[str, Any], base: list[str], versus: list[str] | None) -> dict[str, Any]:
    """The search's results row (store.append's metrics and fields): the winner, tune_vs_hand (null without a
    comparison), the GPU minutes and where every trial's went (trials.spend, the comparison's included as in
    gpu_min_with_comparison), the trial count; the base it started from and the hand side's overrides beside the
    winner's configuration."""
    from vlmtrain.lab.tune import outputs, trials

    useful, what = outputs.winner_figure(state)
    v = state.get("versus") or {}
    metrics = {"winner_useful_tokens_per_s_per_gpu": useful, "tune_vs_hand": None, **v,
               "gpu_min": state["search_gpu_min"], "gpu_min_with_comparison": state["gpu_min"],
               "trials": len(state["trials"]), "pruned": sum(len(st["pruned"]) for st in state["stages"]),
               **trials.spend(t["outcome"] for t in state["trials"].values())}
    return {"metrics": metrics, "base": base, "versus": versus, "config": [*base, *state["winner"]["overrides"]],
            "winner_figure": what}


def main(args: argparse.Namespace) -> int:
    from vlmtrain.config import world
    from vlmtrain.config.overrides import check_args
    from vlmtrain.lab.kit import spec
    from vlmtrain.lab.tune import outputs, search, trials

    config, launcher = split(args.overrides)
    if problem := check_args(config):
        print(f"vlmtrain tune: {problem}", file=sys.stderr)
        return 2
    sp = spec.load(args.spec)
    if not sp.stages:
        print(f"vlmtrain tune: {args.spec} has no stages (a sweep spec? run it with vlmtrain sweep)", file=sys.stderr)
        return 2
    sp.base = [*sp.base, *config]
    name = args.name or default_name(sp.base)
    out = args.dir or Path("outputs") / "tune" / name
    node_gpus = 0 if any("slurm" in o for o in launcher) else world.local_gpus()  # Slurm: the declared world
    gpus = placed_resolved(sp.base, node_gpus)[1].layout.world_size
    if node_gpus == 0 and not launcher and not args.plan:
        print("vlmtrain tune: no GPU on this machine: add --plan for the candidate space, or run on a GPU node "
              "(or with hydra/launcher=slurm)", file=sys.stderr)
        return 2
    if args.results and any(o.startswith("experiment=") for o in sp.base):
        print("vlmtrain tune: a --results row measures a search from the model, data, hardware and world alone: "
              "give those, not an experiment preset (compare against one with --versus)", file=sys.stderr)
        return 2
    try:
        versus = hand_side(args.versus, sp.base, name, node_gpus)
    except ValueError as e:
        print(f"vlmtrain tune: {e}", file=sys.stderr)
        return 2
    print(f"[tune] hand side: {' '.join(versus) if versus else 'none (no comparison)'}", flush=True)
    cache = cache_overrides(sp.base, args.cache_dir or out / "cache")
    s = search.Search(sp, out, name, trials.sweep_process, node_gpus, gpus,
                      budget_gpu_s=args.budget_gpu_min * 60 if args.budget_gpu_min else None,
                      max_wall_s=args.max_wall_min * 60 if args.max_wall_min else None, extra=[*launcher, *cache],
                      versus=versus, plan=args.plan)
    command = experiments.typed(args)
    state = s.run()
    winner, end = state.get("winner"), state["end"]
    preset = None
    useful, what = outputs.winner_figure(state)
    if winner and end["reason"] == "done":
        notes = [f"Found by `{command}` ({out}): {winner['name']}, {useful:.0f} useful tokens/s/GPU, {what}, "
                 f"on {store.machine()} (report: {out / 'report.md'})."]
        preset = outputs.write_preset((args.preset_dir or CONF_DIR / "experiment") / f"{name}.yaml",
                                      [*sp.base, *winner["overrides"]], notes)
    paths = outputs.write(state, out, command, preset)
    for b in state["budget"]:
        print(f"[tune] {outputs.budget_ended(b)}", flush=True)
    if args.plan:
        for stage in state["stages"]:
            for i, p in enumerate(stage.get("predicted") or [], 1):
                print(f"[tune] {stage['name']} predicted #{i}: {p['name']}: {p['step_s']:.2f} s/step, "
                      f"{p['useful_tokens_per_s_per_gpu']:.0f} useful tokens/s/GPU, MFU {p['mfu']:.1%}", flush=True)
    print(f"[tune] {end['why']}\n[tune] next: {end['next']}", flush=True)
    print(f"[tune] report: {paths['md']}" + (f"; preset: {preset}" if preset else ""), flush=True)
    if args.results and winner and preset:
        row = result_row(state, sp.base, versus)
        store.append(args.results, f"tune_{name}", command, row.pop("metrics"), **row, preset=str(preset),
                     tune_dir=str(out))
    if end["reason"] != "done":
        return EXIT[end["reason"]]
    return 0 if winner else 1


def add_arguments(tune: argparse.ArgumentParser) -> None:
    tune.add_argument("overrides", nargs="*", help="train.py overrides: model, data, hardware, nodes, gpus_per_node, "
                      "train.global_batch_size, ...; hydra/launcher=slurm hydra.launcher.* for Slurm")
    tune.add_argument("--budget-gpu-min", type=float, help="GPU minutes the search may spend (every invocation's); "
                      f"one too small for the first stage and the finalists: exit {BLOCKED} before any trial, naming "
                      "the least")
    tune.add_argument("--max-wall-min", type=float, help="start no trial that would end after this many minutes of "
                      f"this invocation; exit {PAUSED}: the same command resumes (exit {BLOCKED}: one trial is longer)")
    tune.add_argument("--spec", default="default", help="conf/tune/<spec>.yaml or a path (default: default)")
    tune.add_argument("--name", help="the preset's and tune dir's name (default: tune_<hash of the overrides>)")
    tune.add_argument("--dir", type=Path, help="tune dir (default: outputs/tune/<name>): state.json, trials, report")
    tune.add_argument("--preset-dir", type=Path, help="where the winner's preset goes (default: conf/experiment)")
    tune.add_argument("--versus", help="a hand-found configuration's overrides (one quoted string): measured against "
                      "the winner in A/B pairs on the same machine (tune_vs_hand); default: the shipped preset of the "
                      "base's model, data, hardware and world (conf/experiment/, none written by a search); none: no "
                      "comparison")
    tune.add_argument("--cache-dir", type=Path, help="data.cache_dir of every trial: the data scan, processor, bins "
                      "and compiled kernels, shared by the trials and kept with the search (default: <tune dir>/cache;"
                      " a base data.cache_dir=... wins)")
    experiments.add_results(tune, None, "none: the search writes its row only where --results names a file")
    tune.add_argument("--plan", action="store_true", help="prune the first stage's candidates and stop (no GPU)")


def run(args: argparse.Namespace) -> int:
    """`main`, a bad spec or --versus refused with exit 2."""
    from vlmtrain.lab.kit import spec

    try:
        return main(args)
    except (spec.SpecError, ValueError) as e:
        print(f"vlmtrain tune: {e}", file=sys.stderr)
        return 2
