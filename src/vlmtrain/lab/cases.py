"""Run named train.py cases on this GPU node and append one row per case to results/<suite>.jsonl. (Benchmarks with
repeats and medians are specs of `vlmtrain sweep`: conf/tune/perf_h200.yaml holds the one-H200 packing cases.)

    python -m vlmtrain.lab.cases gpu_training [--only NAME ...] [--results results/gpu_training.jsonl]

Cases that fit on fewer GPUs than the node has run side by side (CUDA_VISIBLE_DEVICES slots). Each case is a
plain `python train.py <overrides>` run; its metrics.jsonl / checks.json are summarized by vlmtrain.observe.run_summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmtrain.config.world import local_gpus
from vlmtrain.lab import store
from vlmtrain.lab.runner import ROOT
from vlmtrain.observe import run_summary

TINY = ["model=tiny", "train.iterations=12", "train.global_batch_size=8"]
SHAPE_30B = [
    "model=qwen3_vl_30b_a3b",
    "model.num_layers=4",
    "data=realistic",
    "train.iterations=10",
    "train.global_batch_size=8",
]


@dataclass
class Case:
    name: str
    gpus: int
    overrides: list[str] = field(default_factory=list)


SUITES: dict[str, list[Case]] = {
    "gpu_training": [
        Case("tiny_fsdp_ep1_trainable_recompute-none_graph-none_1gpu", 1, TINY),
        Case("tiny_fsdp_ep1_frozen_recompute-none_graph-none_1gpu", 1, [*TINY, "vision=frozen"]),
        Case("tiny_fsdp_ep1_trainable_recompute-selective_graph-none_1gpu", 1, [*TINY, "recompute=selective"]),
        # full recompute needs the projector frozen too (preflight rule deepstack_full_recompute)
        Case(
            "tiny_fsdp_ep1_frozen-projector_recompute-full_graph-none_1gpu",
            1,
            [*TINY, "recompute=full", "vision=frozen_with_projector"],
        ),
        Case(
            "tiny_3d_ep1_trainable_recompute-none_graph-moe_router_preprocess_1gpu",
            1,
            [*TINY, "parallelism=3d", "cuda_graph=moe_router_preprocess"],
        ),
        Case("tiny_3d_ep1_trainable_recompute-none_graph-none_1gpu", 1, [*TINY, "parallelism=3d"]),
        Case("tiny_fsdp_ep2_trainable_recompute-none_graph-none_2gpu", 2, TINY),
        Case("tiny_3d_ep2_trainable_recompute-none_graph-none_2gpu", 2, [*TINY, "parallelism=3d"]),
        Case(
            "tiny_3d_tp2_ep2_trainable_recompute-none_graph-none_2gpu", 2, [*TINY, "parallelism=3d", "parallelism.tp=2"]
        ),
        Case(
            "tiny_3d_pp2_ep1_trainable_recompute-none_graph-none_2gpu",
            2,
            [*TINY, "parallelism=3d", "parallelism.pp=2", "parallelism.ep=1"],
        ),
        Case("30b-shape-l4_fsdp_ep1_trainable_recompute-none_graph-none_1gpu", 1, SHAPE_30B),
        Case("30b-shape-l4_fsdp_ep1_frozen_recompute-none_graph-none_1gpu", 1, [*SHAPE_30B, "vision=frozen"]),
        Case("30b-shape-l4_fsdp_ep2_trainable_recompute-none_graph-none_2gpu", 2, SHAPE_30B),
        Case("30b-shape-l4_3d_ep2_trainable_recompute-none_graph-none_2gpu", 2, [*SHAPE_30B, "parallelism=3d"]),
    ],
}


def overrides(case: Case, dry_run: bool = False) -> list[str]:
    """Everything after `python train.py` but the run directory: the case's full configuration, as recorded."""
    return [*case.overrides, f"gpus_per_node={case.gpus}", f"dry_run={str(dry_run).lower()}", "wandb.enabled=false"]


def command(case: Case, run_dir: Path, dry_run: bool = False) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), *overrides(case, dry_run), f"hydra.run.dir={run_dir}"]


def run_batch(cases: list[Case], out: Path, gpus: int) -> list[tuple[Case, int, Path, float]]:
    """Start cases side by side on disjoint GPU slots; wait for all."""
    procs, next_gpu = [], 0
    for case in cases:
        run_dir = out / case.name
        shutil.rmtree(run_dir, ignore_errors=True)  # a re-run (e.g. of a failed case) must not append to old files
        run_dir.mkdir(parents=True)
        env = dict(
            os.environ,
            CUDA_VISIBLE_DEVICES=",".join(str(next_gpu + i) for i in range(case.gpus)),
            MASTER_PORT=str(29500 + next_gpu * 10),
        )
        next_gpu += case.gpus
        log = (run_dir / "train.log").open("w")
        procs.append(
            (
                case,
                subprocess.Popen(command(case, run_dir), stdout=log, stderr=subprocess.STDOUT, env=env),
                run_dir,
                time.time(),
            )
        )
    return [(c, p.wait(), d, time.time() - t0) for c, p, d, t0 in procs]


def batches(cases: list[Case], gpus: int) -> list[list[Case]]:
    out, cur, used = [], [], 0
    for case in sorted(cases, key=lambda c: c.gpus):
        if used + case.gpus > gpus:
            out.append(cur)
            cur, used = [], 0
        cur.append(case)
        used += case.gpus
    return [*out, cur] if cur else out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("--only", nargs="*", help="case names (substring match)")
    ap.add_argument("--results", type=Path, help="default: results/<suite>.jsonl")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "cases")
    args = ap.parse_args(argv)
    gpus = local_gpus()
    cases = [c for c in SUITES[args.suite] if not args.only or any(s in c.name for s in args.only)]
    cases = [c for c in cases if c.gpus <= gpus]
    results_path = args.results or ROOT / "results" / f"{args.suite}.jsonl"
    failed = 0
    for batch in batches(cases, gpus):
        for case, rc, run_dir, wall in run_batch(batch, args.out, gpus):
            failed += record(case, rc, run_dir, wall, results_path) is None
    return 1 if failed else 0


def record(case: Case, rc: int, run_dir: Path, wall: float, results_path: Path, **extra: Any) -> dict[str, Any] | None:
    """Summarize one finished case and append its row (None, and the log's tail printed, when it failed)."""
    summary = run_summary.summarize(run_dir, keys=run_summary.SUMMARY_KEYS)  # headline, per-component seconds and FLOPs
    checks_file = run_dir / "checks.json"
    checks = json.loads(checks_file.read_text()) if checks_file.exists() else {}
    cmd = "python train.py " + " ".join(overrides(case))
    status = "ok" if rc == 0 and summary else f"failed (rc={rc})"
    print(f"[cases] {case.name}: {status} in {wall:.0f}s {json.dumps(summary)}", flush=True)
    if status != "ok":
        log = run_dir / "train.log"
        print(log.read_text()[-4000:] if log.exists() else f"(no {log})", flush=True)
        return None
    return store.append(results_path, case.name, cmd, summary, checks=checks, wall_s=round(wall, 1), **extra)


if __name__ == "__main__":
    sys.exit(main())
