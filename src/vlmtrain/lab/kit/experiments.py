"""`vlmtrain lab <experiment> ...`: every experiment of the lab behind one parser, the lab's index, and the flags
experiments share.

An experiment is a module with `add_arguments(parser)` (its command line) and `run(args) -> int` (its exit status; 2 for
a bad command line, before any GPU work); its docstring is its `--help`. EXPERIMENTS names each one and says in a line
what it does; the index names modules and imports none until the parser is built. `vlmtrain sweep`, `vlmtrain overhead`
and `vlmtrain tune` are three of them under their own names as well (ALIASES): the commands the results rows and the
docs have always named. The flags many experiments take are declared here once: `add_results` (--results), `add_out`
(--out), `add_commit` (--commit), `add_machine_run` (--machine-run), and the schedule's
(vlmtrain.lab.kit.schedule.add_flags). How to add an experiment: docs/benchmarks.md, "Adding an experiment".

Modules run as processes of their own are not experiments: the ranks torchrun starts (bridge_alone,
bridge_recipe_rank, checks.packing_harness) and verification's logits step (checks.hf_parity).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from vlmtrain.lab.kit.runner import ROOT
from vlmtrain.lab.kit.store import WINDOW_H

EXPERIMENTS = {
    "cases": ("vlmtrain.lab.cases", "named train.py cases, one results row each (the gpu_training suite)"),
    "sweep": ("vlmtrain.lab.sweep", "a spec's named sweeps of cases, one results row each; its report"),
    "overhead": ("vlmtrain.lab.overhead_ab", "vlmtrain vs Bridge's pretrain() alone on a spec's case, in A/B pairs"),
    "tune": ("vlmtrain.lab.tune.command", "search the knobs that matter for this model and world; write the best as a "
                                          "preset"),
    "bridge-recipe": ("vlmtrain.lab.bridge_recipe", "Megatron Bridge's own recipe of a benchmark, the peer, and "
                                                    "vlmtrain's ratio to it"),
    "profile-step": ("vlmtrain.lab.profile_step", "one case of a spec with one step profiled, its summary as a row"),
    "ceiling": ("vlmtrain.lab.micro.ceiling", "bf16 matmul TFLOP/s at the model's GEMM shapes, each tower against it"),
    "vit-attention": ("vlmtrain.lab.micro.vit_attention", "the ViT's attention kernels alone at one packed row"),
    "gdn-varlen": ("vlmtrain.lab.micro.gdn_varlen", "the Gated DeltaNet's kernels on a packed row against each segment "
                                                   "alone, forward and gradients"),
    "logits-memory": ("vlmtrain.lab.micro.logits_memory", "bytes per logit of the cross entropy's implementations"),
    "collate-cpu": ("vlmtrain.lab.micro.collate_cpu", "what one packed row costs a data-loader worker (CPU)"),
    "memory-check": ("vlmtrain.lab.calibrate.memory_check", "the memory estimate against the measured peaks"),
    "metrics-check": ("vlmtrain.lab.calibrate.metrics_check", "a run's MFU and useful tokens, computed another way"),
    "calibrate-speed": ("vlmtrain.lab.calibrate.speed_check", "fit the step-time model on the measured rows; its "
                                                              "held-out error and the published figures"),
    "resume": ("vlmtrain.lab.checks.resume", "kill -9 mid-training, relaunch, compare losses and samples"),
    "reliability": ("vlmtrain.lab.checks.reliability", "secrets, non-finite stop and skip, OOM, kill mid-checkpoint"),
    "slurm-preempt": ("vlmtrain.lab.checks.slurm_preempt", "a Slurm job preempted, requeued and resumed"),
    "precision-parity": ("vlmtrain.lab.checks.precision_parity", "FP8 recipes against BF16: loss parity and speed"),
    "packing-equivalence": ("vlmtrain.lab.checks.packing_equivalence", "packed vs each sample alone, with negative "
                                                                       "controls"),
    "verification": ("vlmtrain.lab.checks.verification", "a Hugging Face checkpoint in, training, a checkpoint out, "
                                                         "each step against transformers"),
    "acceptance": ("vlmtrain.lab.checks.acceptance", "every path a new user takes, through train.py on one GPU"),
    "tiny-hf": ("vlmtrain.lab.checks.tiny_hf", "a small random-init Hugging Face checkpoint of a model family"),
    "config-bytes": ("vlmtrain.lab.checks.config_bytes", "the dry-run Bridge configs of two checkouts, byte for "
                                                         "byte"),
    "results-rows": ("vlmtrain.lab.checks.results_rows", "every results row names its command, date, machine and "
                                                         "metrics"),
}
"""name -> (module, what it does)."""
ALIASES = ("sweep", "overhead", "tune")


def command(module: str) -> str:
    """The command of an experiment module (`vlmtrain lab <name>`, or `vlmtrain <alias>`): what its rows record."""
    name = next(n for n, (m, _) in EXPERIMENTS.items() if m == module)
    return f"vlmtrain {name}" if name in ALIASES else f"vlmtrain lab {name}"


def at_least(n: int, why: str) -> Callable[[str], int]:
    """An argparse type: an int of at least `n`, refused at parse time (exit 2) saying `why`."""
    def parse(text: str) -> int:
        if int(text) < n:
            raise argparse.ArgumentTypeError(f"{text} < {n}: {why}")
        return int(text)

    return parse


def add_results(ap: argparse.ArgumentParser, default: str | None, default_is: str | None = None) -> None:
    """--results: the results file the experiment appends its rows to (default results/<default>, or `default_is`
    where the experiment derives it)."""
    ap.add_argument("--results", type=Path, default=ROOT / "results" / default if default else None,
                    help=f"the results file its rows are appended to (default: {default_is or f'results/{default}'})")


def add_out(ap: argparse.ArgumentParser, name: str, stamped: bool = False) -> None:
    """--out: the folder its run dirs go to (default outputs/<name>, with `stamped` in a folder of this minute)."""
    default = ROOT / "outputs" / name
    ap.add_argument("--out", type=Path, default=default / time.strftime("%Y%m%d-%H%M%S") if stamped else default,
                    help=f"where its run dirs go (default: outputs/{name}{'/<now>' if stamped else ''})")


def add_machine_run(ap: argparse.ArgumentParser) -> None:
    """--machine-run: the tag of the batch of measurements its rows belong to (vlmtrain.lab.kit.store)."""
    ap.add_argument("--machine-run", default=None, metavar="TAG",
                    help="the machine run its rows belong to (default: this host and GPUs' batch begun less than "
                         f"{WINDOW_H} hours ago in the results file, else a new one)")


def add_commit(ap: argparse.ArgumentParser) -> None:
    """--commit: the commit the runs were made with, recorded in every row (default $VLMTRAIN_COMMIT)."""
    ap.add_argument("--commit", default=os.environ.get("VLMTRAIN_COMMIT", "unknown"),
                    help="the commit the runs were made with, recorded in every row (default: $VLMTRAIN_COMMIT)")


def typed(args: argparse.Namespace) -> str:
    """The command line as typed (`args.argv`, which the `vlmtrain` command keeps), for a row or a preset that
    records it; `vlmtrain lab <alias> ...` is written `vlmtrain <alias> ...`, the form the rows and presets name."""
    argv = list(args.argv)
    if argv[:1] == ["lab"] and argv[1:2] and argv[1] in ALIASES:
        argv = argv[1:]
    return shlex.join(["vlmtrain", *argv])


def _add(sub: argparse._SubParsersAction, name: str) -> None:
    module, what = EXPERIMENTS[name]
    mod = importlib.import_module(module)
    ap = sub.add_parser(name, help=what, description=mod.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mod.add_arguments(ap)
    ap.set_defaults(func=mod.run)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """`vlmtrain lab <experiment>` for every experiment, and the aliases beside `lab`."""
    lab = sub.add_parser("lab", help="the lab's experiments: benchmarks, calibrations, GPU checks",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    experiments = lab.add_subparsers(dest="experiment", required=True, metavar="<experiment>")
    for name in EXPERIMENTS:
        _add(experiments, name)
    for name in ALIASES:
        _add(sub, name)
