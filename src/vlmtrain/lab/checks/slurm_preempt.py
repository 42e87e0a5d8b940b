"""Preemption under Slurm: a real training job through `python train.py -m hydra/launcher=slurm` on a real Slurm
with the real GPU as gres (a one-node Slurm on this node, partition debug), preempted mid-run and resumed; this
module's command appends the row to results/reliability.jsonl, tests/gpu/test_slurm_preempt_gpu.py asserts the same.

    vlmtrain lab slurm-preempt --case tiny            # the plumbing, ~2 min
    vlmtrain lab slurm-preempt --case 30b --only reference   # then, in the next call:
    vlmtrain lab slurm-preempt --case 30b --only preempt

- reference: the same training uninterrupted, run directly (`python train.py`, no checkpoints): cheaper than a
  second Slurm job, and the losses do not depend on the launcher.
- preempt: the job is submitted through submitit; once it has logged the size's `signal_after` steps the check sends
  `scancel --signal=USR2` (what Slurm sends `signal_delay_s` before a time limit, and what submitit's own
  job._interrupt() sends). vlmtrain relays it to Bridge as SIGTERM (launch/slurm.py), Bridge saves a checkpoint
  after the step and exits, submitit requeues the same job id, and the second attempt resumes in the same run dir
  from that checkpoint. Checked: one checkpoint, at the step the signal caught (Bridge's checkpoint.save_interval
  is 0, so no interval or final save can have made it); the rank record's attempts (same job id, restart count 1,
  the signal); Slurm's Restarts=1 and COMPLETED; Bridge's load message in the requeued attempt's log; every step
  logged exactly once; losses within resume.TOLERANCE of the reference at every step.

A 30B-A3B checkpoint holds the BF16 weights and Adam's FP32 state (master weights, two moments): about
params + optimizer of the memory estimate, ~48 GiB at 4 layers. The check refuses a checkpoint dir without
that much free space (plus a margin) before any GPU work, naming the fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmtrain.lab.checks.resume import TOLERANCE, losses, max_loss_diff, tracker
from vlmtrain.lab.kit import baselines, experiments, runner, store
from vlmtrain.lab.kit.case import Case, placed_resolved
from vlmtrain.lab.kit.runner import ROOT
from vlmtrain.observe import run_summary

GIB = 1024**3
DISK_MARGIN_GIB = 4.0  # torch_dist metadata, the common state, the run dir
SAMPLES = ("train.micro_batch_size=1", "train.global_batch_size=2")  # 2 micro-batches a step: short steps


@dataclass(frozen=True)
class Preemption:
    """One model size the check preempts: its training (both runs share it) and the logged steps before the
    signal."""

    case: Case
    signal_after: int


def trained(name: str, overrides: list[str]) -> Case:
    return Case(name, 1, overrides, dry_run=False)


CASES = {
    "30b": Preemption(trained("qwen3_vl_30b_a3b_l4", [*baselines.SHAPE_30B, *SAMPLES, "train.iterations=8"]), 3),
    # tiny steps take a fraction of a second: 56 steps after the signal so that it lands mid-run
    "tiny": Preemption(trained("tiny", [*baselines.TINY, *SAMPLES, "train.iterations=60"]), 4),
}
"""--case -> the preemption."""


def iterations(case: Case) -> int:
    return int(case.setting("train.iterations") or 0)


def with_layers(p: Preemption, layers: int) -> Preemption:
    """The preemption with `layers` decoder layers (the 30B-A3B shape's depth, for a disk that cannot hold 4
    layers')."""
    depth = [f"model.num_layers={layers}" if o.startswith("model.num_layers=") else o for o in p.case.overrides]
    return dataclasses.replace(p, case=dataclasses.replace(p.case, name=f"{p.case.name.rsplit('_l', 1)[0]}_l{layers}",
                                                           overrides=depth))


def saving(case: Case, ckpt: Path) -> Case:
    """The case with checkpoints in `ckpt`, where only the exit signal saves one."""
    return case.plus("train.save_interval=1000000", f"train.checkpoint_dir={ckpt}",
                     # Bridge's 0: no interval save and no save at the end (train.py: `save_interval != 0`); the
                     # signal's stays
                     "+bridge.checkpoint.save_interval=0")


LAUNCHER = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=8",
            "hydra.launcher.timeout_min=30"]
"""hydra/launcher=slurm on the one-node Slurm slurm_start.sh brings up (partition debug, no time pressure: the check
sends the signal itself)."""


def checkpoint_gib(case: Case) -> float:
    """What one checkpoint of the case holds: BF16 weights + Adam's FP32 state (the memory estimate's params and
    optimizer, world size 1) of the run as train.py places it."""
    from vlmtrain.check.memory.estimate import estimate

    b = estimate(*placed_resolved(case))
    return b.params + b.optimizer


def disk_problem(case: Case, ckpt: Path, need_gib: float, free_gib: float) -> str | None:
    """Why the checkpoint cannot go to `ckpt` (None: it fits, with DISK_MARGIN_GIB to spare)."""
    if free_gib >= need_gib + DISK_MARGIN_GIB:
        return None
    return (f"a checkpoint of {case.name} needs ~{need_gib + DISK_MARGIN_GIB:.1f} GiB, {ckpt} has {free_gib:.1f} "
            "GiB free: pass --ckpt <a dir on a larger filesystem>, or fewer decoder layers (--layers N)")


def check_disk(case: Case, ckpt: Path) -> dict[str, float]:
    """Free space where the checkpoint goes against its size; refuses (before any GPU work) when it cannot fit."""
    ckpt.mkdir(parents=True, exist_ok=True)
    need, free = checkpoint_gib(case), shutil.disk_usage(ckpt).free / GIB
    if problem := disk_problem(case, ckpt, need, free):
        raise SystemExit(problem)
    return {"checkpoint_estimate_gib": round(need, 1), "disk_free_gib": round(free, 1)}


def _sh(*cmd: str) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except OSError as e:
        return str(e)
    return out.stdout + out.stderr


def slurm_problem() -> str | None:
    """Why the local Slurm cannot take the job (None: it can): its commands, an idle node, a GPU as gres."""
    if shutil.which("sbatch") is None:
        return ("no Slurm commands on PATH: start a one-node Slurm on this node (partition debug, the GPU as gres) "
                "and put its bin/ on PATH")
    state = _sh("sinfo", "-h", "-n", "localhost", "-o", "%T").strip()
    if state != "idle":
        return f"Slurm node localhost is {state or 'absent'!r}, not idle: start or resume it (scontrol, slurmd)"
    gres = _sh("sinfo", "-h", "-n", "localhost", "-o", "%G").strip()
    if not re.search(r"gpu:[1-9]", gres):
        return f"the Slurm node has no GPU gres ({gres!r}): start it with GPUS=1"
    return None


def slurm_version() -> str:
    return _sh("scontrol", "--version").strip()


def diagnostics(sweep: Path, job_id: str | None) -> str:
    """What Slurm and the job's logs say: printed on every failure (a GPU job is seldom debugged interactively)."""
    parts = [_sh("sinfo", "-N", "-l"), _sh("squeue", "-a")]
    if job_id:
        parts.append(_sh("scontrol", "show", "job", job_id))
    for log in sorted((sweep / ".submitit").glob("*/*_log.*")) + sorted(Path("/var/log/slurm").glob("*.log")):
        parts.append(f"---- tail {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
    return "\n".join(parts)


def _env() -> dict[str, str]:
    """This checkout's src first on PYTHONPATH (absolute: the Slurm job inherits it and starts elsewhere)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}


def run_reference(case: Case, out: Path, timeout_s: float) -> tuple[int, Path]:
    """The uninterrupted run, directly (torchrun on the local GPU), no checkpoints; past `timeout_s` its whole
    tree is killed (a surviving rank would hold the GPU)."""
    run = runner.start(case, out / "reference", log=out / "reference" / "console.txt", env=_env(),
                       timeout_s=timeout_s, fresh=True)
    return run.wait(), run.run_dir


def _rank0(sweep: Path) -> dict[str, Any] | None:
    found = list(sweep.glob("0_*/rank0.json"))
    return json.loads(found[0].read_text()) if found else None


def submitted(case: Case, ckpt: Path) -> Case:
    """The case as the Slurm job runs it: `-m` through the launcher, its checkpoints in `ckpt`."""
    return saving(case, ckpt).plus(*LAUNCHER, multirun=True)


def run_preempted(p: Preemption, out: Path, ckpt: Path, timeout_s: float) -> dict[str, Any]:
    """Submit through submitit, USR2 once `signal_after` steps are logged, wait for the requeued attempt."""
    sweep = out / "slurm"
    shutil.rmtree(ckpt, ignore_errors=True)
    run = runner.start(submitted(p.case, ckpt), sweep, log=out / "launcher.txt", env=_env(), fresh=True)
    deadline, job_id, sent = time.monotonic() + timeout_s, None, None
    while run.poll() is None and time.monotonic() < deadline:
        rec = _rank0(sweep)
        job_id = job_id or (rec or {}).get("slurm", {}).get("job_id")
        steps = losses(next(sweep.glob("0_*"))) if rec else {}
        if job_id and sent is None and len(steps) >= p.signal_after:
            sent = {"after_steps_logged": len(steps), "at": time.strftime("%H:%M:%S"),
                    "scancel": _sh("scancel", "--signal=USR2", job_id).strip()}
        time.sleep(0.5)
    rc: int | None = run.wait(max(1.0, deadline - time.monotonic()))
    if run.timed_out:  # the launcher's tree was killed at the deadline: the job goes too
        rc = None
        if job_id:
            _sh("scancel", job_id)
    job = scontrol_job(job_id, wait_s=60 if rc is not None else 5) if job_id else {}
    return {"rc": rc, "job_id": job_id, "sent": sent, "sweep": sweep, "job": job}


def scontrol_job(job_id: str, wait_s: float = 60) -> dict[str, str]:
    """`scontrol show job -o` as {key: value} once the job has ended (the launcher returns on submitit's result
    file, while the task may still be exiting); Slurm keeps an ended job MinJobAge=300 s, no accounting needed."""
    deadline = time.monotonic() + wait_s
    while True:
        job = dict(kv.split("=", 1) for kv in _sh("scontrol", "show", "job", "-o", job_id).split() if "=" in kv)
        if job.get("JobState") not in ("RUNNING", "COMPLETING", "PENDING") or time.monotonic() > deadline:
            return job
        time.sleep(1)


def evaluate(p: Preemption, reference: Path, slurm: dict[str, Any], ckpt: Path) -> tuple[bool, dict[str, Any]]:
    """Every check of the module docstring, from what the runs wrote and what Slurm said about the job
    (`slurm`: run_preempted's result); (passed, metrics)."""
    sweep: Path = slurm["sweep"]
    run_dirs = list(sweep.glob("0_*"))
    run_dir = run_dirs[0] if run_dirs else sweep / "missing"
    rec = _rank0(sweep) or {}
    first = (rec.get("previous") or [{}])[0]
    job = slurm["job"]
    iters = sorted(int(p.name.split("_")[1]) for p in ckpt.glob("iter_*"))
    saved = tracker(ckpt)
    logs = "".join(p.read_text(errors="replace") for p in sorted((sweep / ".submitit").glob("*/*_log.*")))
    loaded = re.findall(r"successfully loaded checkpoint from (\S+) .*?at iteration (\d+)", logs)
    rows = [r["step"] for r in run_summary.read_jsonl(run_dir / "metrics.jsonl") if "lm_loss" in r]
    ref, got = losses(reference), losses(run_dir)
    cut = saved if saved is not None else len(rows) + 1  # no checkpoint: nothing counts as resumed
    after = sorted(s for s in got if s >= cut)

    m: dict[str, Any] = {
        "job_id": slurm["job_id"], "launcher_rc": slurm["rc"], "signal_sent": slurm["sent"],
        "signal_recorded": first.get("signal"), "restart_count": rec.get("slurm", {}).get("restart_count"),
        "same_job_id": bool(first) and first.get("slurm", {}).get("job_id") == slurm["job_id"],
        "slurm_state": job.get("JobState"), "slurm_restarts": job.get("Restarts"),
        "checkpoints": iters, "checkpoint_step": saved,
        "bridge_exit_on_signal": "exiting program after receiving SIGTERM" in logs,
        "requeued_by_submitit": "Requeued job" in logs,
        "loaded": [{"dir": d, "iteration": int(i)} for d, i in loaded],
        "steps_logged": len(rows), "steps_logged_twice": sorted({s for s in rows if rows.count(s) > 1}),
        "first_step_after_resume": min(after, default=None),
        "max_abs_loss_diff_before_signal": max_loss_diff(ref, got, [s for s in got if s < cut]),
        "max_abs_loss_diff_after_resume": max_loss_diff(ref, got, after), "tolerance": TOLERANCE,
    }
    ok = (slurm["rc"] == 0 and m["signal_sent"] is not None and (m["signal_recorded"] or {}).get("name") == "SIGUSR2"
          and m["restart_count"] == "1" and m["same_job_id"] and m["slurm_state"] == "COMPLETED"
          and m["slurm_restarts"] == "1" and saved is not None and iters == [saved]
          and p.signal_after <= saved < iterations(p.case) and m["bridge_exit_on_signal"]
          and m["requeued_by_submitit"]
          and m["loaded"] == [{"dir": str(ckpt), "iteration": saved}]
          and sorted(rows) == list(range(iterations(p.case))) and set(ref) == set(range(iterations(p.case)))
          and m["first_step_after_resume"] == saved
          and m["max_abs_loss_diff_before_signal"] <= TOLERANCE and m["max_abs_loss_diff_after_resume"] <= TOLERANCE)
    m["losses_reference"], m["losses_slurm"] = ref, got
    return ok, m


def command(case: Case, ckpt: Path) -> str:
    return runner.recorded(submitted(case, ckpt).plus("hydra.sweep.dir=<out>/slurm"))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--case", choices=list(CASES), default="tiny")
    ap.add_argument("--only", choices=["reference", "preempt", "both"], default="both",
                    help="reference: the uninterrupted run only; preempt: the Slurm run, against a reference "
                    "an earlier call left in --out")
    experiments.add_out(ap, "slurm_preempt")
    ap.add_argument("--ckpt", type=Path, default=None, help="default /tmp/vlmtrain_slurm_ckpt/<case>")
    ap.add_argument("--layers", type=int, default=None, help="--case 30b with this many decoder layers (default 4): "
                    "where the disk cannot hold the 4-layer checkpoint")
    ap.add_argument("--timeout", type=float, default=540, help="seconds per phase")
    experiments.add_results(ap, "reliability.jsonl")


def run(a: argparse.Namespace) -> int:
    p = CASES[a.case] if a.layers is None else with_layers(CASES[a.case], a.layers)
    case = p.case
    out = (a.out / a.case).resolve()
    ckpt = (a.ckpt or Path("/tmp/vlmtrain_slurm_ckpt") / a.case).resolve()
    if a.only != "reference":
        if problem := slurm_problem():
            print(f"[slurm_preempt] {problem}", file=sys.stderr)
            return 2
        disk = check_disk(case, ckpt)
        print(f"[slurm_preempt] checkpoint ~{disk['checkpoint_estimate_gib']} GiB, {disk['disk_free_gib']} GiB free")
    if a.only != "preempt":
        rc, ref_dir = run_reference(case, out, a.timeout)
        print(f"[slurm_preempt] reference exit {rc}, {len(losses(ref_dir))} steps: {ref_dir}", flush=True)
        if rc != 0 or a.only == "reference":
            if rc:
                print((ref_dir / "console.txt").read_text()[-6000:], file=sys.stderr)
            return rc
    if not losses(out / "reference"):
        print(f"[slurm_preempt] no reference losses in {out / 'reference'}: run --only reference first",
              file=sys.stderr)
        return 2
    slurm = run_preempted(p, out, ckpt, a.timeout)
    ok, metrics = evaluate(p, out / "reference", slurm, ckpt)
    ref_losses, slurm_losses = metrics.pop("losses_reference"), metrics.pop("losses_slurm")
    store.append(a.results, f"slurm_preempt_{case.name}_1gpu", command(case, ckpt), {**metrics, **disk,
                   "slurm": slurm_version(), "passed": ok}, losses_uninterrupted=ref_losses,
                   losses_preempted_and_resumed=slurm_losses,
                   runner=f"{experiments.command(__name__)} --case {a.case}"
                   + (f" --layers {a.layers}" if a.layers else ""))
    print(json.dumps({"case": a.case, "passed": ok, **metrics}, default=str), flush=True)
    if not ok:
        print(diagnostics(slurm["sweep"], slurm["job_id"]), file=sys.stderr)
        print((out / "launcher.txt").read_text()[-4000:], file=sys.stderr)
    return 0 if ok else 1
