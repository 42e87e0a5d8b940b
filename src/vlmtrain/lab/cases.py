"""The `cases` experiment: named train.py cases run on this GPU node, one row per case in results/<suite>.jsonl.
(Benchmarks with repeats and medians are specs of `vlmtrain sweep`: conf/tune/perf_h200.yaml holds the one-H200
packing cases.)

    vlmtrain lab cases gpu_training [--only NAME ...] [--results results/gpu_training.jsonl]

Cases that fit on fewer GPUs than the node has run side by side (CUDA_VISIBLE_DEVICES slots). Each case is a
plain `python train.py <overrides>` run (vlmtrain.lab.kit.runner); its metrics.jsonl / checks.json make its row
(vlmtrain.lab.kit.store.record).
"""

from __future__ import annotations

import argparse

from vlmtrain.config.world import local_gpus
from vlmtrain.lab.kit import experiments, runner, store
from vlmtrain.lab.kit.baselines import SHAPE_30B, TINY, steps
from vlmtrain.lab.kit.case import Case
from vlmtrain.lab.kit.runner import ROOT


def trained(name: str, gpus: int, overrides: list[str]) -> Case:
    """A suite's case: trained on `gpus` GPUs (dry_run=false on the command line)."""
    return Case(name, gpus, overrides, dry_run=False)


TINY_12 = [*TINY, *steps(12)]
SHAPE_30B_10 = [*SHAPE_30B, *steps(10)]
SUITES: dict[str, list[Case]] = {
    "gpu_training": [
        trained("tiny_fsdp_ep1_trainable_recompute-none_graph-none_1gpu", 1, TINY_12),
        trained("tiny_fsdp_ep1_frozen_recompute-none_graph-none_1gpu", 1, [*TINY_12, "vision=frozen"]),
        trained("tiny_fsdp_ep1_trainable_recompute-selective_graph-none_1gpu", 1, [*TINY_12, "recompute=selective"]),
        # full recompute needs the projector frozen too (preflight rule deepstack_full_recompute)
        trained(
            "tiny_fsdp_ep1_frozen-projector_recompute-full_graph-none_1gpu",
            1,
            [*TINY_12, "recompute=full", "vision=frozen_with_projector"],
        ),
        trained(
            "tiny_3d_ep1_trainable_recompute-none_graph-moe_router_preprocess_1gpu",
            1,
            [*TINY_12, "parallelism=3d", "cuda_graph=moe_router_preprocess"],
        ),
        trained("tiny_3d_ep1_trainable_recompute-none_graph-none_1gpu", 1, [*TINY_12, "parallelism=3d"]),
        trained("tiny_fsdp_ep2_trainable_recompute-none_graph-none_2gpu", 2, TINY_12),
        trained("tiny_3d_ep2_trainable_recompute-none_graph-none_2gpu", 2, [*TINY_12, "parallelism=3d"]),
        trained(
            "tiny_3d_tp2_ep2_trainable_recompute-none_graph-none_2gpu",
            2,
            [*TINY_12, "parallelism=3d", "parallelism.tp=2"],
        ),
        trained(
            "tiny_3d_pp2_ep1_trainable_recompute-none_graph-none_2gpu",
            2,
            [*TINY_12, "parallelism=3d", "parallelism.pp=2", "parallelism.ep=1"],
        ),
        trained("30b-shape-l4_fsdp_ep1_trainable_recompute-none_graph-none_1gpu", 1, SHAPE_30B_10),
        trained("30b-shape-l4_fsdp_ep1_frozen_recompute-none_graph-none_1gpu", 1, [*SHAPE_30B_10, "vision=frozen"]),
        trained("30b-shape-l4_fsdp_ep2_trainable_recompute-none_graph-none_2gpu", 2, SHAPE_30B_10),
        trained("30b-shape-l4_3d_ep2_trainable_recompute-none_graph-none_2gpu", 2, [*SHAPE_30B_10, "parallelism=3d"]),
    ],
}


def batches(cases: list[Case], gpus: int) -> list[list[Case]]:
    out, cur, used = [], [], 0
    for case in sorted(cases, key=lambda c: c.gpus):
        if used + case.gpus > gpus:
            out.append(cur)
            cur, used = [], 0
        cur.append(case)
        used += case.gpus
    return [*out, cur] if cur else out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("--only", nargs="*", help="case names (substring match)")
    experiments.add_results(ap, None, "results/<suite>.jsonl")
    experiments.add_out(ap, "cases")


def run(args: argparse.Namespace) -> int:
    gpus = local_gpus()
    cases = [c for c in SUITES[args.suite] if not args.only or any(s in c.name for s in args.only)]
    cases = [c for c in cases if c.gpus <= gpus]
    results_path = args.results or ROOT / "results" / f"{args.suite}.jsonl"
    failed = 0
    for batch in batches(cases, gpus):
        for case, rc, run_dir, wall in runner.side_by_side(batch, args.out):
            failed += store.record(case, rc, run_dir, wall, results_path) is None
    return 1 if failed else 0
