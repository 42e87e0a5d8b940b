"""`vlmtrain <command>`: tools around training runs (training itself is `python train.py`, a Hydra app)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _report(args: argparse.Namespace) -> int:
    """Write the sweep report; imported lazily so `vlmtrain --help` stays fast."""
    from vlmtrain.report import write_report

    paths = write_report(args.source, args.out)
    for path in paths.values():
        print(path)
    return 0


def _profile(args: argparse.Namespace) -> int:
    """Summarize a profiled step (train.profile_step); imported lazily like report."""
    from vlmtrain.report import profile

    try:
        print(profile.render(profile.summarize(args.path)))
    except FileNotFoundError as e:
        print(f"vlmtrain profile: {e}")
        return 2
    return 0


def parser() -> argparse.ArgumentParser:
    """One sub-parser per command, so later commands add a function and three lines here."""
    ap = argparse.ArgumentParser(prog="vlmtrain", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="rank a sweep by useful tokens/s/GPU, explain failures, plot",
                         description="Write report.md, report.csv and PNG plots for a Hydra multirun directory, "
                         "one run directory, or a W&B group.")
    rep.add_argument("source", help="multirun dir, run dir, or wandb:<entity>/<project>/<group> (W&B API)")
    rep.add_argument("--out", type=Path, help="output directory (default: the sweep dir; report-<group> for wandb:)")
    rep.set_defaults(func=_report)
    prof = sub.add_parser("profile", help="where a profiled step's GPU and idle time went (train.profile_step)",
                          description="Summarize the PyTorch-profiler trace of a run started with "
                          "train.profile_step=N: GPU busy fraction, kernel ms by family and by the Python code that "
                          "launched them, GPU idle ms by what the host was inside. Writes profile_summary.json.")
    prof.add_argument("path", type=Path, help="run directory, or a rank-0.json.gz trace")
    prof.set_defaults(func=_profile)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # `python -m vlmtrain.cli ...` where the `vlmtrain` script is not installed
    sys.exit(main())
