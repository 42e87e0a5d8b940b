"""`vlmtrain <command>`: tools around training runs (training itself is `python train.py`, a Hydra app)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _report(args: argparse.Namespace) -> int:
    """Write the sweep report; imported lazily so `vlmtrain --help` stays fast."""
    from vlmtrain.report import write_report

    try:
        paths = write_report(args.source, args.out)
    except FileNotFoundError as e:
        print(f"vlmtrain report: {e}", file=sys.stderr)
        return 2
    for path in paths.values():
        print(path)
    return 0


def _wandb(args: argparse.Namespace) -> int:
    """Build, write and publish a sweep's W&B views, or publish written ones; imported lazily like report."""
    from vlmtrain.report import wandb_views

    if args.wandb_command == "views":
        return wandb_views.views(args.source, args.out, args.entity, "--offline" if args.offline else None)
    return wandb_views.publish_main(args.spec, args.entity)


def _profile(args: argparse.Namespace) -> int:
    """Summarize a profiled step (train.profile_step); imported lazily like report."""
    from vlmtrain.report import profile

    try:
        print(profile.render(profile.summarize(args.path)))
    except FileNotFoundError as e:
        print(f"vlmtrain profile: {e}")
        return 2
    return 0


def _quiet_datasets() -> None:
    """No `datasets` progress bars between the lines these commands print."""
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()


def _data_export(args: argparse.Namespace) -> int:
    """Write the shipped photos in one data kind's format; prints the overrides that train on them."""
    from vlmtrain.data.export import export

    _quiet_datasets()
    try:
        manifest = export(args.format, args.out, args.dataset, args.corrupt, args.cache_dir, args.samples)
    except (ValueError, FileExistsError) as e:
        print(f"vlmtrain data export: {e}", file=sys.stderr)
        return 2
    print(f"wrote {manifest['samples']} samples, {manifest['images']} images ({len(manifest['corrupt'])} corrupt) "
          f"to {manifest['path']}")
    for bad in manifest["corrupt"]:
        print(f"  corrupt: {bad['sample']} (id {bad['id']}), image {bad['image']}")
    print("train with: python train.py " + " ".join(manifest["overrides"]))
    return 0


def _data_check(args: argparse.Namespace) -> int:
    """Compose the data overrides as train.py does, scan every sample on CPU, list the bad ones."""
    from vlmtrain.config.compose import compose
    from vlmtrain.config.overrides import check_args
    from vlmtrain.data import prepare

    if problem := check_args(args.overrides):
        print(f"vlmtrain data check: {problem}", file=sys.stderr)
        return 2
    _quiet_datasets()
    try:
        report = prepare.scan(compose(args.overrides))
    except (FileNotFoundError, ValueError) as e:  # ValueError: a value the schema refuses, named with the fix
        print(f"vlmtrain data check: {e}", file=sys.stderr)
        return 2
    if report is None:
        print("data=mock: Bridge's generated noise images, nothing to scan.")
        return 0
    for line in report.lines():
        print(line)
    print(report.summary())
    return 1 if report.bad else 0


def _export(args: argparse.Namespace) -> int:
    """A run's checkpoint as a Hugging Face checkpoint; imported lazily like report."""
    from vlmtrain.train import hf_export

    return hf_export.main(args.run_dir, args.iteration, args.out, args.hf_path, args.launcher)


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
    wdb = sub.add_parser("wandb", help="a sweep's W&B workspace and report (saved views), built from code")
    wdb_sub = wdb.add_subparsers(dest="wandb_command", required=True)
    views = wdb_sub.add_parser("views", help="build a sweep's W&B workspace and report; publish them when online",
                               description="Build the sweep's W&B workspace (sections ranking, towers, memory, "
                               "training, failures; runs filtered to its group and grouped by the knobs that vary) "
                               "and report, write them as wandb_views.json (+ wandb_views.png) next to the sweep, and "
                               "publish them when a W&B API key and server are at hand (else print the command that "
                               "publishes them later).")
    views.add_argument("source", help="a -m sweep's multirun dir, or wandb:<entity>/<project>/<group> (W&B API)")
    views.add_argument("--out", type=Path, help="where to write (default: the sweep dir; report-<group> for wandb:)")
    views.add_argument("--entity", help="the W&B entity to publish to (default: the runs', else your default)")
    views.add_argument("--offline", action="store_true", help="write the views only, do not publish")
    views.set_defaults(func=_wandb)
    pub = wdb_sub.add_parser("publish", help="upload a sweep's offline runs and save its written W&B views",
                             description="Upload the sweep's offline W&B runs not yet synced, then save the "
                             "workspace and report of a wandb_views.json; prints their URLs (and keeps them in the "
                             "file, so publishing again updates the same views). Exit status 2 when it cannot now.")
    pub.add_argument("spec", type=Path, help="wandb_views.json, as `vlmtrain wandb views` wrote it")
    pub.add_argument("--entity", help="the W&B entity to publish to (default: the runs', else your default)")
    pub.set_defaults(func=_wandb)
    prof = sub.add_parser("profile", help="where a profiled step's GPU and idle time went (train.profile_step)",
                          description="Summarize the PyTorch-profiler trace of a run started with "
                          "train.profile_step=N: GPU busy fraction, kernel ms by family and by the Python code that "
                          "launched them, GPU idle ms by what the host was inside. Writes profile_summary.json.")
    prof.add_argument("path", type=Path, help="run directory, or a rank-0.json.gz trace")
    prof.set_defaults(func=_profile)
    data = sub.add_parser("data", help="write the shipped photos in a data format; scan a dataset for bad samples")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    exp = data_sub.add_parser("export", help="the shipped real photos as jsonl, parquet, hf or energon data",
                              description="Write the sample (or realistic) set into OUT in one format, offline; "
                              "--corrupt N truncates N images. Prints the train.py overrides for it.")
    exp.add_argument("--format", required=True, choices=("jsonl", "parquet", "hf", "energon"))
    exp.add_argument("--out", required=True, type=Path, help="folder to write (replaced if it holds an export)")
    exp.add_argument("--dataset", default="sample", choices=("sample", "realistic"))
    exp.add_argument("--samples", type=int, help="sample: the first N photos; realistic: N generated samples")
    exp.add_argument("--corrupt", type=int, default=0, metavar="N", help="truncate the first image of N samples")
    exp.add_argument("--cache-dir", type=Path, help="where the sets are generated (default: data.cache_dir's)")
    exp.set_defaults(func=_data_export)
    chk = data_sub.add_parser("check", help="scan a run's dataset on CPU and list every bad sample",
                              description="Compose the run from train.py overrides (e.g. data=parquet "
                              "data.path=x.parquet), decode every image, list the bad samples and a summary. Exit "
                              "status 1 when there is a bad sample.")
    chk.add_argument("overrides", nargs="*", help="train.py overrides (data=..., data.path=..., train.seq_length=...)")
    chk.set_defaults(func=_data_check)
    hfx = sub.add_parser("export", help="a run's checkpoint as a Hugging Face checkpoint (from_pretrained loads it)",
                         description="Convert a run's saved checkpoint (torch_dist or fsdp_dtensor) into a Hugging "
                         "Face checkpoint with Megatron Bridge's exporter, on a GPU node (an fsdp_dtensor one of more "
                         "GPUs resharded into its GPUs) or through Slurm on the run's own world: config, safetensors "
                         "and processor in OUT, moved there once complete.")
    hfx.add_argument("run_dir", type=Path, help="the run dir (holds run_config.yaml)")
    hfx.add_argument("--iteration", type=int, help="a saved iteration (default: the latest checkpointed)")
    hfx.add_argument("--out", required=True, type=Path, help="an empty or new folder")
    hfx.add_argument("--hf-path", help="where the run's model.hf_path checkpoint is now, if it moved")
    hfx.add_argument("launcher", nargs="*", help="fsdp_dtensor only: hydra/launcher=slurm [hydra.launcher.<key>="
                     "<value> ...] exports on the run's own world through Slurm (else on this node's GPUs, resharded "
                     "where the run had more); anywhere on the line")
    hfx.set_defaults(func=_export)
    from vlmtrain.lab.kit import experiments  # the experiments' argparse definitions: no torch, no Bridge

    experiments.add_parsers(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = parser()
    args, extra = ap.parse_known_args(argv)
    if extra and args.command != "export":
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:  # the export's launcher overrides after its options (argparse fills a trailing positional once)
        args.launcher = [*args.launcher, *extra]
    args.argv = argv  # the command line as typed, for an experiment's rows
    return args.func(args)


if __name__ == "__main__":  # `python -m vlmtrain.cli ...` where the `vlmtrain` script is not installed
    sys.exit(main())
