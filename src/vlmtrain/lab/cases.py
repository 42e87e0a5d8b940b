"""The lab's one definition of a named run, `Case`, with the shared model baselines and the real-file datasets cases
read: every experiment names its runs with them (docs/benchmarks.md, "Adding an experiment"). And the `cases`
experiment: named train.py cases run on this GPU node, one row per case in results/<suite>.jsonl. (Benchmarks with
repeats and medians are specs of `vlmtrain sweep`: conf/tune/perf_h200.yaml holds the one-H200 packing cases.)

    vlmtrain lab cases gpu_training [--only NAME ...] [--results results/gpu_training.jsonl]

Cases that fit on fewer GPUs than the node has run side by side (CUDA_VISIBLE_DEVICES slots). Each case is a
plain `python train.py <overrides>` run (vlmtrain.lab.kit.runner); its metrics.jsonl / checks.json are summarized by
vlmtrain.observe.run_summary.

The lab's two one-GPU benchmarks, by the names its cases, rows and docstrings use (conf/tune/perf_h200.yaml runs them):
- H1: one H200 training Qwen3-VL-30B-A3B's layer shapes at 4 decoder layers (L4_30B) with the full 27-layer ViT,
  vision and decoder trainable, data=realistic, train.seq_length=4096, BF16 (its fastest configuration ships as
  experiment=perf_h200_best);
- H2: the same for Qwen3.5-VL-35B-A3B (L4_35).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.config.world import local_gpus
from vlmtrain.lab.kit import runner, store
from vlmtrain.lab.kit.runner import ROOT
from vlmtrain.observe import run_summary

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

TINY = ["model=tiny"]
L4_30B = ["model=qwen3_vl_30b_a3b", "model.num_layers=4"]
"""Qwen3-VL-30B-A3B's layer shapes at 4 decoder layers: the fewest that hold its 3 deepstack layers."""
SHAPE_30B = [*L4_30B, "data=realistic"]
L4_35 = ["model=qwen35_vl_35b_a3b", "model.num_layers=4"]
"""Qwen3.5-VL-35B-A3B's layer shapes at 4 decoder layers (benchmark H2's): one 3:1 block of Gated DeltaNet and
attention."""
SHAPE_35 = [*L4_35, "data=realistic"]
L2_35 = ["model=qwen35_vl_35b_a3b", "model.num_layers=2", "model.linear_attention.full_attention_interval=2"]
"""H2's layer shapes at 2 decoder layers, one Gated DeltaNet and one full attention: both mixers at the real shapes
in what one 80 GB H100 holds with the optimizer (H2's 4 layers do not)."""
TINY_QWEN35 = ["model=tiny_qwen35"]
# The largest 235B depth one H200 holds (memory estimate 92.5 GiB): one layer, so one deepstack merger.
SHAPE_235B = ["model=qwen3_vl_235b_a22b", "model.num_layers=1", "model.vit.deepstack_indexes=[8]", "data=realistic"]


INPUTS = "{inputs}"
"""Placeholder in a case's overrides for the folder `export_inputs` writes the real-file datasets into."""
EXPORTS = {"jsonl": 0, "parquet": 0, "hf": 0, "energon": 0, "parquet_bad": 2}
"""Folder under INPUTS -> its corrupt images (the format is the folder name's first part)."""


def export_inputs(inputs: Path) -> None:
    """The shipped sample photos in each file format a case reads (what `vlmtrain data export` writes), each folder
    once."""
    from vlmtrain.data.export import export

    for folder, corrupt in EXPORTS.items():
        if not (inputs / folder).exists():
            export(folder.split("_")[0], inputs / folder, corrupt=corrupt)


def with_inputs(overrides: list[str], inputs: Path) -> list[str]:
    """The overrides with INPUTS replaced by the folder."""
    return [o.replace(INPUTS, str(inputs)) for o in overrides]


def steps(iterations: int, global_batch_size: int = 8) -> list[str]:
    """A baseline's length: train.iterations and train.global_batch_size."""
    return [f"train.iterations={iterations}", f"train.global_batch_size={global_batch_size}"]


@dataclass
class Case:
    """A named run of the lab: `python train.py <overrides>` on `gpus` GPUs (or, with `module`, that module in each
    rank), and what it must end with. A spec's cases, tune's candidates, the preemption check's sizes, the acceptance
    suite, packing equivalence and the verification runs are all Cases; what an experiment needs beside one holds
    one (a tune candidate: its pruning)."""

    name: str
    gpus: int = 1
    overrides: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    """The spec's knob values the case was made from (vlmtrain.lab.kit.spec: a search's next stage varies them)."""
    module: str | None = None
    """What each torchrun rank runs on the case's saved run config instead of training (runner.start_ranks: a
    check's own rank); None: `python train.py`."""
    multirun: bool = False
    """`python train.py -m`: its overrides are a sweep, run in a sweep dir of its own."""
    exclusive: bool = False
    """Runs with no other case beside it on its GPUs (a large model); other cases run side by side where they fit."""
    interrupt_after: int | None = None
    """The logged step after which a check interrupts the run (a kill, a preemption signal)."""
    expect_rc: int = 0
    expect: dict[str, Any] = field(default_factory=dict)
    """What else its run must show (the acceptance suite's verdict: skipped_samples, message, sweep_jobs,
    max_first_step_s)."""

    def setting(self, key: str) -> str | None:
        """The value the overrides give `key` (the last one, as Hydra takes it); None where they give none."""
        return next((o.split("=", 1)[1] for o in reversed(self.overrides) if o.split("=", 1)[0] == key), None)


TINY_12 = [*TINY, *steps(12)]
SHAPE_30B_10 = [*SHAPE_30B, *steps(10)]
SUITES: dict[str, list[Case]] = {
    "gpu_training": [
        Case("tiny_fsdp_ep1_trainable_recompute-none_graph-none_1gpu", 1, TINY_12),
        Case("tiny_fsdp_ep1_frozen_recompute-none_graph-none_1gpu", 1, [*TINY_12, "vision=frozen"]),
        Case("tiny_fsdp_ep1_trainable_recompute-selective_graph-none_1gpu", 1, [*TINY_12, "recompute=selective"]),
        # full recompute needs the projector frozen too (preflight rule deepstack_full_recompute)
        Case(
            "tiny_fsdp_ep1_frozen-projector_recompute-full_graph-none_1gpu",
            1,
            [*TINY_12, "recompute=full", "vision=frozen_with_projector"],
        ),
        Case(
            "tiny_3d_ep1_trainable_recompute-none_graph-moe_router_preprocess_1gpu",
            1,
            [*TINY_12, "parallelism=3d", "cuda_graph=moe_router_preprocess"],
        ),
        Case("tiny_3d_ep1_trainable_recompute-none_graph-none_1gpu", 1, [*TINY_12, "parallelism=3d"]),
        Case("tiny_fsdp_ep2_trainable_recompute-none_graph-none_2gpu", 2, TINY_12),
        Case("tiny_3d_ep2_trainable_recompute-none_graph-none_2gpu", 2, [*TINY_12, "parallelism=3d"]),
        Case(
            "tiny_3d_tp2_ep2_trainable_recompute-none_graph-none_2gpu",
            2,
            [*TINY_12, "parallelism=3d", "parallelism.tp=2"],
        ),
        Case(
            "tiny_3d_pp2_ep1_trainable_recompute-none_graph-none_2gpu",
            2,
            [*TINY_12, "parallelism=3d", "parallelism.pp=2", "parallelism.ep=1"],
        ),
        Case("30b-shape-l4_fsdp_ep1_trainable_recompute-none_graph-none_1gpu", 1, SHAPE_30B_10),
        Case("30b-shape-l4_fsdp_ep1_frozen_recompute-none_graph-none_1gpu", 1, [*SHAPE_30B_10, "vision=frozen"]),
        Case("30b-shape-l4_fsdp_ep2_trainable_recompute-none_graph-none_2gpu", 2, SHAPE_30B_10),
        Case("30b-shape-l4_3d_ep2_trainable_recompute-none_graph-none_2gpu", 2, [*SHAPE_30B_10, "parallelism=3d"]),
    ],
}


def overrides(case: Case, dry_run: bool = False) -> list[str]:
    """Everything after `python train.py` but the run directory: the case's full configuration, as recorded."""
    return [*case.overrides, f"gpus_per_node={case.gpus}", f"dry_run={str(dry_run).lower()}", "wandb.enabled=false"]


@functools.lru_cache(maxsize=1024)
def _composed(overrides: tuple[str, ...], compose_kw: tuple[tuple[str, str], ...] = ()) -> RunConfig:
    """Each run composed once per process (Hydra's composition is most of a check): a tune search checks the same
    runs again in later stages, on resume and for its finalists."""
    from vlmtrain.config.compose import compose

    return compose(list(overrides), **dict(compose_kw))


def placed_resolved(overrides: list[str], node_gpus: int = 0, **compose_kw: str) -> tuple[RunConfig, Resolved]:
    """The run `python train.py <overrides>` trains, composed in this process, placed on its world with its `auto`
    options settled there, and resolved (check.defaults.placed): the one Resolved every lab path that builds,
    estimates or launches a run in process hands down. `node_gpus`: this node's GPUs (0: the world the run declares
    in `gpus_per_node`)."""
    from vlmtrain.check import defaults

    # placing settles a run in place: each caller gets its own copy, the cached one stays as composed
    run = copy.deepcopy(_composed(tuple(overrides), tuple(sorted(compose_kw.items()))))
    return run, defaults.placed(run, node_gpus)[1]


def command(case: Case, run_dir: Path, dry_run: bool = False) -> list[str]:
    return runner.argv(overrides(case, dry_run), run_dir)


def start(case: Case, run_dir: Path, gpus: list[int] | None = None) -> runner.Run:
    """The case's run in a fresh run_dir (on the GPUs `gpus` where given)."""
    return runner.start(overrides(case), run_dir, gpus=gpus, fresh=True)


def run_batch(cases: list[Case], out: Path, gpus: int) -> list[tuple[Case, int, Path, float]]:
    """Start cases side by side on disjoint GPU slots; wait for all."""
    runs, next_gpu = [], 0
    for case in cases:
        runs.append((case, start(case, out / case.name, list(range(next_gpu, next_gpu + case.gpus)))))
        next_gpu += case.gpus
    return [(c, r.wait(), r.run_dir, r.wall_s()) for c, r in runs]


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
    ap.add_argument("--results", type=Path, help="default: results/<suite>.jsonl")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "cases")


def run(args: argparse.Namespace) -> int:
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
    cmd = runner.recorded(overrides(case))
    status = "ok" if rc == 0 and summary else f"failed (rc={rc})"
    print(f"[cases] {case.name}: {status} in {wall:.0f}s {json.dumps(summary)}", flush=True)
    if status != "ok":
        log = run_dir / "train.log"
        print(log.read_text()[-4000:] if log.exists() else f"(no {log})", flush=True)
        return None
    return store.append(results_path, case.name, cmd, summary, checks=checks, wall_s=round(wall, 1), **extra)
