"""The dry-run Bridge config of a fixed set of configurations, written so two checkouts can be compared byte for byte:
the proof that a refactor left every run's ConfigContainer as it was.

    vlmtrain lab config-bytes write DIR [--checkout PATH]  # one <case>.yaml each (CPU, ~20 s a case)
    vlmtrain lab config-bytes compare BEFORE AFTER  # exit 1 naming each case that differs

Each case is `python train.py <overrides> dry_run=true` into its own run dir (of another checkout with --checkout: a
git worktree of the commit before a change, its own src/ on PYTHONPATH); its bridge_config.yaml is copied with
the checkout's path and the run dir replaced by placeholders (two checkouts live in different folders). CASES touch
every option of every config group at least once and all four models; the data kinds that read files read the ones
`vlmtrain data export` writes into DIR first.
"""

from __future__ import annotations

import argparse
import hashlib
import re
from pathlib import Path

from vlmtrain.lab.kit import baselines, runner
from vlmtrain.lab.kit.baselines import INPUTS, SHAPE_30B, TINY
from vlmtrain.lab.kit.case import Case
from vlmtrain.lab.kit.runner import ROOT


def dry(name: str, overrides: list[str]) -> Case:
    """A dry run on the world its overrides declare (gpus_per_node where they name one, else the hardware's)."""
    return Case(name, None, overrides, dry_run=True)


CASES = [
    dry("tiny_defaults", TINY),
    dry("tiny_3d_fast_selective_graph", [*TINY, "parallelism=3d", "kernels=fast", "recompute=selective",
                                         "cuda_graph=moe_router_preprocess", "dispatcher=alltoall", "hardware=h100"]),
    dry("tiny_jsonl_frozen", [*TINY, "data=jsonl", f"data.path={INPUTS}/jsonl/data.jsonl", "vision=frozen"]),
    dry("tiny_parquet_full_recompute", [*TINY, "data=parquet", f"data.path={INPUTS}/parquet/data.parquet",
                                        "recompute=full", "vision=frozen_with_projector"]),
    dry("tiny_hf", [*TINY, "data=hf", f"data.path={INPUTS}/hf"]),
    dry("tiny_jsonl_packed", [*TINY, "data=jsonl", f"data.path={INPUTS}/jsonl/data.jsonl", "data.packing=2048",
                              "train.micro_batch_size=1"]),
    dry("tiny_energon", [*TINY, "data=energon", f"data.path={INPUTS}/energon"]),
    dry("30b_l4_realistic_fp8_3d", [*SHAPE_30B, "precision=fp8", "parallelism=3d", "gpus_per_node=2"]),
    dry("35b_l4_mock_b200_mxfp8", ["model=qwen35_vl_35b_a3b", "model.num_layers=4", "data=mock", "hardware=b200",
                                   "precision=mxfp8", "dispatcher=deepep", "gpus_per_node=8",
                                   "cuda_graph=attn_moe_router_preprocess"]),
    dry("235b_l3_gb200_nvfp4_hybridep", ["model=qwen3_vl_235b_a22b", "model.num_layers=3", "hardware=gb200",
                                         "precision=nvfp4", "dispatcher=hybridep", "nodes=2", "data=mock"]),
    dry("experiment_perf_h200_best", ["experiment=perf_h200_best"]),
    dry("experiment_perf_h200x2_best", ["experiment=perf_h200x2_best"]),
    dry("experiment_fsdp_first_gb200", ["experiment=fsdp_first_gb200"]),
    dry("experiment_3d_gb200", ["experiment=3d_gb200"]),
    dry("experiment_tune_h1", ["experiment=tune_h1"]),
]
"""Dry runs: each on the world its overrides declare."""
BINS_FILE = re.compile(r"^(\s*bins_file: )(\S+)$", re.M)


def normalized(text: str, run_dir: Path, checkout: Path, inputs: Path) -> str:
    """Paths that differ between checkouts replaced; a packed case's bins cache file (its name keys the data files'
    modification times) replaced by the hash of what it holds."""
    text = BINS_FILE.sub(lambda m: m[1] + "<bins sha1 " + hashlib.sha1(Path(m[2]).read_bytes()).hexdigest() + ">", text)
    return (text.replace(str(run_dir), "<run_dir>").replace(str(inputs), "<inputs>")
            .replace(str(checkout), "<checkout>"))


def write(out: Path, only: list[str] | None = None, checkout: Path = ROOT, inputs: Path | None = None) -> int:
    """`inputs`: the exported datasets (default DIR/inputs); give both sides of a comparison the same folder, since
    the packed cases' bins cache key holds the data files' modification times."""
    out.mkdir(parents=True, exist_ok=True)
    inputs = inputs or out / "inputs"
    baselines.export_inputs(inputs)
    failed = []
    for case in CASES:
        if only and case.name not in only:
            continue
        name, run_dir = case.name, out / "runs" / case.name
        run = runner.start(baselines.with_inputs(case, inputs), run_dir, log=out / "logs" / f"{name}.log",
                           env={"PYTHONPATH": str(checkout / "src")}, checkout=checkout, fresh=True)
        rc, yaml = run.wait(), run_dir / "bridge_config.yaml"
        if rc != 0 or not yaml.is_file():
            failed.append(name)
            print(f"[config-bytes] {name}: exit {rc}\n{run.log.read_text(errors='replace')[-4000:]}")
            continue
        (out / f"{name}.yaml").write_text(normalized(yaml.read_text(), run_dir, checkout, inputs))
        print(f"[config-bytes] {name}: {len(yaml.read_bytes())} bytes", flush=True)
    return 1 if failed else 0


def compare(before: Path, after: Path) -> int:
    differ = []
    for name in (c.name for c in CASES):
        a, b = before / f"{name}.yaml", after / f"{name}.yaml"
        same = a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()
        print(f"[config-bytes] {name}: {'identical' if same else 'DIFFERENT or missing'}")
        differ += [] if same else [name]
    return 1 if differ else 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    sub = ap.add_subparsers(dest="action", required=True)
    w = sub.add_parser("write")
    w.add_argument("out", type=Path)
    w.add_argument("--only", nargs="*", choices=[c.name for c in CASES])
    w.add_argument("--checkout", type=Path, default=ROOT, help="the checkout whose train.py runs (default: this one)")
    w.add_argument("--inputs", type=Path, help="the exported datasets' folder (default: OUT/inputs)")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)


def run(args: argparse.Namespace) -> int:
    if args.action == "compare":
        return compare(args.before, args.after)
    return write(args.out, args.only, args.checkout.resolve(), args.inputs)
