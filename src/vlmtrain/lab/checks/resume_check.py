"""Kill -9 a GPU run mid-training, relaunch the same command, and compare its losses with an uninterrupted run.

    python -m vlmtrain.lab.checks.resume_check --parallelism fsdp --gpu 0     # Megatron-FSDP, fsdp_dtensor checkpoints
    python -m vlmtrain.lab.checks.resume_check --parallelism 3d --gpu 1       # 3D, torch_dist checkpoints
    python -m vlmtrain.lab.checks.resume_check --parallelism fsdp --packed  # packed (data.packing=1024)

Run A trains 12 steps uninterrupted. Run B is the same command with its own checkpoint_dir: it is killed with
SIGKILL (whole process tree) once it has checkpointed step 4 and logged step 6, then relaunched unchanged; it
must resume from the checkpoint and reproduce A's losses. Appends one row to results/resume.jsonl.

The data position too: every run writes samples.jsonl (the sample indices of each step's micro-batches, per
data-parallel rank). B's steps before its checkpoint (from the killed run) and from the checkpoint on (from the
resumed run) must be exactly A's: the same samples at every step, none twice and none skipped. With --packed
the row goes to results/reliability.jsonl (issue 25's data-position check).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vlmtrain.lab import store
from vlmtrain.lab.checks.resume import (
    PACKING,
    TOLERANCE,
    command,
    data_position,
    kill_tree,
    launch,
    losses,
    max_loss_diff,
    overrides,
    samples,
    tracker,
)
from vlmtrain.lab.runner import ROOT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parallelism", choices=["fsdp", "3d"], required=True)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "resume")
    ap.add_argument("--packed", action="store_true",
                    help=f"data.packing={PACKING} (MBS 1, GBS 8 rows); the row goes to reliability.jsonl")
    ap.add_argument("--results", type=Path, default=None, help="default: results/resume.jsonl "
                    "(results/reliability.jsonl with --packed)")
    a = ap.parse_args()
    a.results = a.results or ROOT / "results" / ("reliability.jsonl" if a.packed else "resume.jsonl")
    tag = f"{a.parallelism}_packed" if a.packed else a.parallelism
    out = a.out / tag
    run_a = launch(overrides(a.parallelism, out / "ckpt_a", a.packed), out / "a", a.gpu)
    b_args = overrides(a.parallelism, out / "ckpt_b", a.packed)
    run_b = launch(b_args, out / "b_killed", a.gpu)
    deadline = time.time() + 400
    while time.time() < deadline and run_b.poll() is None:
        if tracker(out / "ckpt_b") is not None and max(losses(out / "b_killed"), default=-1) >= 5:
            break
        time.sleep(0.5)
    killed_at = max(losses(out / "b_killed"), default=-1)
    kill_tree(run_b)
    resumed_from = tracker(out / "ckpt_b")
    rc_b = launch(b_args, out / "b_resumed", a.gpu).wait()
    rc_a = run_a.wait()
    la, lk, lr = losses(out / "a"), losses(out / "b_killed"), losses(out / "b_resumed")
    diff = max_loss_diff(la, lr)
    position = data_position(samples(out / "a"), samples(out / "b_killed"), samples(out / "b_resumed"), resumed_from)
    ok = rc_a == 0 and rc_b == 0 and resumed_from is not None and diff <= TOLERANCE and min(lr) > 0 \
        and not position["sample_steps_mismatched"] and position["same_samples_overall"]
    cmd = command(b_args)
    store.append(
        a.results,
        f"resume_{tag}_tiny_1gpu",
        cmd,
        {
            "killed_after_step": killed_at,
            "checkpoint_step": resumed_from,
            "first_step_after_resume": min(lr, default=None),
            "max_abs_loss_diff": diff,
            "tolerance": TOLERANCE,
            **position,
            "passed": bool(ok),
        },
        losses_uninterrupted=la,
        losses_before_kill=lk,
        losses_after_resume=lr,
        runner=f"python -m vlmtrain.lab.checks.resume_check --parallelism {a.parallelism} --gpu {a.gpu}"
        + (" --packed" if a.packed else ""),
    )
    print(
        json.dumps(
            {
                "parallelism": a.parallelism,
                "ok": bool(ok),
                "diff": diff,
                "resumed_from": resumed_from,
                **position,
                "killed_at": killed_at,
                "a": la,
                "resumed": lr,
            }
        ),
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
