"""Packing equivalence on a GPU: the same real samples through one packed (THD) forward/backward vs each sample
alone, on the real model Bridge builds for the run, with negative controls that break what packing must keep.

    vlmtrain lab packing-equivalence [--only CASE ...]  # GPU -> results/packing_equivalence.jsonl

This module is the driver (the cases, their launch, the rows); vlmtrain.lab.checks.packing_harness is the rank.

Each case composes a run (`data=realistic`, parallelism=3d on one GPU, the MoE auxiliary loss off), lets Bridge's
own `setup()` build the model and optimizer, and then, in this one rank:

- alone: each sample collated alone by Bridge's Qwen collate (padded) through Bridge's `qwen3_vl_step` forward,
  the step vlmtrain trains unpacked data with; packed: the samples of a micro-batch as one bin of vlmtrain's
  packed dataset (vlmtrain.data.bins_dataset.BinDataset: Bridge's Qwen collate with `enable_in_batch_packing`), one
  THD row through Bridge's `vlm_step`, the step vlmtrain trains packed data with; with each sample's segment
  aligned to 1 and to 64 tokens, and as a static row (padded past the longest compared row). The model computes
  MRoPE positions from the packed params itself (Bridge's get_rope_index).
- per-token cross entropy on the loss tokens, packed vs alone, and the cosine of the gradient of the summed loss
  (every parameter's main_grad), packed vs the sum of the alone ones, also per part of the model with that part's
  gradient norm (`grad_by_part`: which part disagrees, and how much of the whole it weighs);
- controls, forward only, measured on the loss tokens of each row's samples after the first (the only tokens a
  control can change): `positions` permutes each sample's MRoPE positions (all three sections together, fixed
  seed; attention boundaries kept); `boundaries` runs the row as one sequence (cu_seqlens [0, T]) with the
  per-sample positions kept. Each must miss the CE tolerance by CONTROL_MARGIN at some model state where the
  packed-vs-alone comparison passes; at random init attention is nearly uniform and positions barely matter, so
  the model is trained on packed rows (TRAIN_STEPS per round, the real Megatron optimizer, other samples than the
  compared ones) until both have, or another round would pass the case's budget (`--budget-s`). The bars are the
  state's own: vlmtrain.lab.checks.packing_verdict says how they are measured.
- the case's row is written after every measured state and rewritten after the next (one row per run: a run
  stopped by a time limit keeps what it measured, `complete: false`); at the budget the rank is killed.
- Qwen3.5 (models with Megatron Core GatedDeltaNet layers) adds the `gdn_boundaries` control: the GDN layers run
  the row as one sequence (no cu_seqlens into FLA's causal conv1d and chunked delta rule, so the conv window and
  the recurrent state cross each boundary) while attention and positions stay per sample
  (vlmtrain.lab.checks.packing_gdn_control); `boundaries` there breaks both mixers.
- `whole_row_positions` is recorded, not a control: positions computed over the whole row as one sequence shift
  every position of a later sample by one constant (get_rope_index continues from the previous sample), and RoPE
  attention depends only on position differences, so with the boundaries kept it changes nothing but rounding.

What packing changes on purpose: Megatron's MoE auxiliary load-balancing loss (`aux_loss`) is computed over the
tokens of a micro-batch, so a packed row balances over all its samples' tokens where an unpacked micro-batch of
one sample balances over that sample only: the comparison runs with moe_aux_loss_coeff=0 and docs/data.md says so.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from vlmtrain.lab.checks import packing_harness as harness
from vlmtrain.lab.kit import baselines, experiments, runner, store
from vlmtrain.lab.kit.case import Case, placed_resolved
from vlmtrain.lab.kit.runner import ROOT

BASE = [
    "data=realistic",
    "data.payload.images_per_sample=[0.25,0.45,0.2,0.1]",  # some text-only samples next to 1-3 images
    "data.payload.num_samples=64",
    "parallelism=3d",
    "gpus_per_node=1",
    "wandb.enabled=false",
    "train.micro_batch_size=1",
    "train.global_batch_size=1",
    "+bridge.model.moe_aux_loss_coeff=0.0",
    # one rank, and backward outside Megatron's schedule: no overlapped gradient reduce / parameter gather
    "+bridge.ddp.overlap_grad_reduce=false",
    "+bridge.ddp.overlap_param_gather=false",
]
LOG = "equivalence.log"
"""The rank's output, in the case's run dir."""


def case(name: str, overrides: list[str]) -> Case:
    """A one-GPU case on BASE whose rank is the harness."""
    return Case(name, 1, [*BASE, *overrides], module=harness.__name__)


CASES = [
    case("tiny_kernels-default", [*baselines.TINY, "kernels=default"]),
    case("tiny_kernels-fast", [*baselines.TINY, "kernels=fast"]),
    # 4 layers: the fewest that hold the 3 deepstack layers (preflight deepstack_on_first_stage)
    case("30b-shape-l4_kernels-default", [*baselines.L4_30B, "kernels=default"]),
    case("30b-shape-l4_kernels-fast", [*baselines.L4_30B, "kernels=fast"]),
    # Qwen3.5 (Gated DeltaNet 3:1 full attention): preflight refuses its packing until these pass
    case("tiny-qwen35_kernels-default", [*baselines.TINY_QWEN35, "kernels=default"]),
    case("h2-shape-l4_kernels-default", [*baselines.L4_35, "kernels=default"]),
    case("h2-shape-l4_kernels-fast", [*baselines.L4_35, "kernels=fast"]),
    # one H100: the precision-aware optimizer's 16-bit remainders (exact) leave room for the training rounds
    case("h2-shape-l2-gdn-attn_kernels-default", [*baselines.L2_35, "kernels=default",
                                                   "precision.precision_aware_optimizer=true"]),
]


POLL_S = 5.0
"""How often the driver looks for a newly measured state while the rank runs."""


def run_cases(only: list[str] | None, results_path: Path, commit: str, budget_s: float) -> int:
    """Each case in its own one-rank torchrun (Bridge's setup owns the process's global state): compose and place
    as train.py does, preflight, scan the data on CPU, launch `main` on the saved run config as a run's ranks are
    launched, its row written after every state it measures; past `budget_s` the rank is killed."""
    from vlmtrain.check import preflight
    from vlmtrain.data import prepare

    failed = 0
    for c in CASES:
        if only and c.name not in only:
            continue
        name, run_dir = c.name, ROOT / "outputs" / "packing_equivalence" / c.name
        run, res = placed_resolved(c.overrides, output_dir=str(run_dir))
        preflight.enforce(run, res)
        prepare.prepare(run, res)
        result = run_dir / harness.RESULT
        result.unlink(missing_ok=True)
        os.environ[harness.DEADLINE_ENV] = str(time.time() + budget_s)
        ranks = runner.start_ranks(c, run, res, log=run_dir / LOG, timeout_s=budget_s)
        at = results_path.stat().st_size if results_path.exists() else 0
        command = f"{experiments.command(__name__)} --only {name}"
        seen = None
        while ranks.poll() is None and ranks.wall_s() < budget_s:
            time.sleep(POLL_S)
            if result.exists() and result.stat().st_mtime != seen:
                seen = result.stat().st_mtime
                _write(results_path, at, name, command, commit, c.overrides, result, rc=None)
        rc = ranks.wait()
        if rc:
            print(ranks.log.read_text(errors="replace")[-4000:], flush=True)
        out = _write(results_path, at, name, command, commit, c.overrides, result, rc=rc)
        passed = rc == 0 and out.get("passed", False)
        failed += not passed
        print(f"[equivalence] {name}: rc {rc}, {'passed' if passed else 'NOT passed'} after "
              f"{out.get('trained_steps')} trained steps ({ranks.wall_s():.0f} s)", flush=True)
    return int(failed > 0)


def _write(results: Path, at: int, name: str, command: str, commit: str, overrides: list[str], result: Path,
           rc: int | None) -> dict[str, Any]:
    """The case's row from the rank's RESULT as it stands, in place of the row this run wrote before (the file
    cut back to `at`, its size when the case began); returns its metrics. rc None: the rank still runs."""
    out = json.loads(result.read_text()) if result.exists() else {}
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a") as f:
        f.truncate(at)
    metrics = {"rc": rc, **out.get("metrics", {})}
    store.append(results, f"packing-equivalence_{name}", command, metrics, commit=commit, overrides=overrides,
                 complete=rc is not None, tolerances=out.get("tolerances"), rows=out.get("rows"),
                 images_per_row=out.get("images_per_row"), bridge_patches=out.get("bridge_patches"),
                 history=out.get("history"))
    return metrics


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", nargs="*", choices=[c.name for c in CASES], help="case names (default: every case)")
    experiments.add_results(ap, "packing_equivalence.jsonl")
    experiments.add_commit(ap)
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="wall seconds per case, startup included: no round starts that would end past it, and the "
                    "rank is killed at it (its row keeps every state measured)")


def run(args: argparse.Namespace) -> int:
    return run_cases(args.only, args.results, args.commit, args.budget_s)
