"""`vlmtrain tune`: compose the base, run the staged search (vlmtrain.lab.tune.search) in the tune dir, write the winner
as a preset and the report; `--results` appends the search's row (winner, GPU minutes, tune_vs_hand). Every
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

from vlmtrain.config.compose import CONF_DIR
from vlmtrain.lab import store

PAUSED = 3
"""Exit status of an invocation that hit --max-wall-min: run the same command again to resume."""
BLOCKED = 4
"""Exit status where the same command would run nothing: a larger --budget-gpu-min or --max-wall-min is needed."""
EXIT = {"wall": PAUSED, "wall_short": BLOCKED, "too_small": BLOCKED, "plan": 0}
"""Exit status by why the search stopped (search.Search.end); done: 0 with a winner, else 1."""


def split(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the configuration, the launcher's settings): hydra/launcher=slurm and hydra.* go to every trial, not into
    the preset."""
    launcher = [o for o in overrides if o.lstrip("+").startswith(("hydra/", "hydra."))]
    return [o for o in overrides if o not in launcher], launcher


def default_name(base: list[str]) -> str:
    return "tune_" + hashlib.sha1(" ".join(base).encode()).hexdigest()[:8]


def main(args: argparse.Namespace) -> int:
    from vlmtrain.config import world
    from vlmtrain.config.overrides import check_args
    from vlmtrain.lab import spec
    from vlmtrain.lab.tune import outputs, search, space, trials
    
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
    gpus = space.placed_resolved(sp.base, node_gpus)[1].layout.world_size
    if node_gpus == 0 and not launcher and not args.plan:
        print("vlmtrain tune: no GPU on this machine: add --plan for the candidate space, or run on a GPU node "
              "(or with hydra/launcher=slurm)", file=sys.stderr)
        return 2
    versus = shlex.split(args.versus) if args.versus else None
    s = search.Search(sp, out, name, trials.sweep_process, node_gpus, gpus,
                      budget_gpu_s=args.budget_gpu_min * 60 if args.budget_gpu_min else None,
                      max_wall_s=args.max_wall_min * 60 if args.max_wall_min else None, extra=launcher, versus=versus,
                      plan=args.plan)
    command = "vlmtrain tune " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["tune"] else args.overrides)
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
    print(f"[tune] {end['why']}\n[tune] next: {end['next']}", flush=True)
    print(f"[tune] report: {paths['md']}" + (f"; preset: {preset}" if preset else ""), flush=True)
    if args.results and winner and preset:
        v = state.get("versus") or {}
        store.append(args.results, f"tune_{name}", command, {
            "winner_useful_tokens_per_s_per_gpu": useful, **v, "gpu_min": state["search_gpu_min"],
            "gpu_min_with_comparison": state["gpu_min"], "trials": len(state["trials"]),
            "pruned": sum(len(st["pruned"]) for st in state["stages"])},
            config=[*sp.base, *winner["overrides"]], winner_figure=what, versus=versus, preset=str(preset),
            tune_dir=str(out))
    if end["reason"] != "done":
        return EXIT[end["reason"]]
    return 0 if winner else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    tune = sub.add_parser("tune", help="search the guidance's knobs for this model and world; write the best as a "
                          "preset", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
                      "the winner in A/B pairs on the same machine (tune_vs_hand)")
    tune.add_argument("--results", type=Path, help="append the search's row (winner, gpu_min, tune_vs_hand) here")
    tune.add_argument("--plan", action="store_true", help="prune the first stage's candidates and stop (no GPU)")
    tune.set_defaults(func=main)
