"""Issue 25 item 1 on the GPU machine: a real training job through hydra/launcher=slurm, preempted with Slurm's
USR2, saved by Bridge on the signal, requeued by submitit, resumed in the same run dir; its losses against an
uninterrupted run (vlmtrain.lab.checks.slurm_preempt says what is checked). One row in results/reliability.jsonl.

    bash scripts/device/slurm_start.sh && export PATH=/tmp/slurm-root/bin:$PATH
    python -m vlmtrain.lab.checks.slurm_preempt_check --case tiny            # the plumbing, ~2 min
    python -m vlmtrain.lab.checks.slurm_preempt_check --case 30b --only reference   # then, in the next call:
    python -m vlmtrain.lab.checks.slurm_preempt_check --case 30b --only preempt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vlmtrain.lab import store
from vlmtrain.lab.checks import slurm_preempt as sp
from vlmtrain.lab.checks.resume import losses
from vlmtrain.lab.runner import ROOT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=list(sp.CASES), default="tiny")
    ap.add_argument("--only", choices=["reference", "preempt", "both"], default="both",
                    help="reference: the uninterrupted run only; preempt: the Slurm run, against a reference "
                    "an earlier call left in --out")
    ap.add_argument("--out", type=Path, default=None, help="default outputs/slurm_preempt/<case>")
    ap.add_argument("--ckpt", type=Path, default=None, help="default /tmp/vlmtrain_slurm_ckpt/<case>")
    ap.add_argument("--layers", type=int, default=None, help="--case 30b with this many decoder layers (default 4): "
                    "where the disk cannot hold the 4-layer checkpoint")
    ap.add_argument("--timeout", type=float, default=540, help="seconds per phase")
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "reliability.jsonl")
    a = ap.parse_args()
    case = sp.CASES[a.case] if a.layers is None else sp.with_layers(sp.CASES[a.case], a.layers)
    out = (a.out or ROOT / "outputs" / "slurm_preempt" / a.case).resolve()
    ckpt = (a.ckpt or Path("/tmp/vlmtrain_slurm_ckpt") / a.case).resolve()
    if a.only != "reference":
        if problem := sp.slurm_problem():
            print(f"[slurm_preempt] {problem}", file=sys.stderr)
            return 2
        disk = sp.check_disk(case, ckpt)
        print(f"[slurm_preempt] checkpoint ~{disk['checkpoint_estimate_gib']} GiB, {disk['disk_free_gib']} GiB free")
    if a.only != "preempt":
        rc, ref_dir = sp.run_reference(case, out, a.timeout)
        print(f"[slurm_preempt] reference exit {rc}, {len(losses(ref_dir))} steps: {ref_dir}", flush=True)
        if rc != 0 or a.only == "reference":
            if rc:
                print((ref_dir / "console.txt").read_text()[-6000:], file=sys.stderr)
            return rc
    if not losses(out / "reference"):
        print(f"[slurm_preempt] no reference losses in {out / 'reference'}: run --only reference first",
              file=sys.stderr)
        return 2
    slurm = sp.run_preempted(case, out, ckpt, a.timeout)
    ok, metrics = sp.evaluate(case, out / "reference", slurm, ckpt)
    ref_losses, slurm_losses = metrics.pop("losses_reference"), metrics.pop("losses_slurm")
    store.append(a.results, f"slurm_preempt_{case.name}_1gpu", sp.command(case, ckpt), {**metrics, **disk,
                   "slurm": sp.slurm_version(), "passed": ok}, losses_uninterrupted=ref_losses,
                   losses_preempted_and_resumed=slurm_losses,
                   runner=f"python -m vlmtrain.lab.checks.slurm_preempt_check --case {a.case}"
                   + (f" --layers {a.layers}" if a.layers else ""))
    print(json.dumps({"case": a.case, "passed": ok, **metrics}, default=str), flush=True)
    if not ok:
        print(sp.diagnostics(slurm["sweep"], slurm["job_id"]), file=sys.stderr)
        print((out / "launcher.txt").read_text()[-4000:], file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
