"""`vlmtrain <command>`: tools around training runs (training itself is `python train.py`, a Hydra app)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _report(args: argparse.Namespace) -> int:
    """Write the sweep report; imported lazily so `vlmtrain --help` stays fast."""
    from vlmtrain.report import write_report

    paths = write_report(args.source, args.out)
    for path in paths.values():
        print(path)
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
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)
