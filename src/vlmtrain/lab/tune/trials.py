"""One trial: `python train.py -m <overrides>` (the path every `-m` sweep takes: the sweeper's preflight for the world
it will run on, its launcher, local GPUs or Slurm through `hydra/launcher=slurm`), watched while it runs.

A trial is a sweep of one job in `<trial dir>` (its run dir `<trial dir>/run`, with metrics.jsonl). Its outcome is
vlmtrain's own summary of that run dir (vlmtrain.observe.run_summary.summarize). A trial whose first measured steps run
slower than `slower_than` x the best so far is stopped there (early stopping), its partial summary kept.

Where a trial's GPU time goes (`spend`): its startup (the first metrics row's spans, vlmtrain.observe.startup:
launcher, rank setup, first step), the warm-up steps after the first, the measured steps, and the rest (Python and
Hydra starting before flow.main, the exit, a trial that failed before its first step).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vlmtrain.lab.kit import runner
from vlmtrain.lab.kit.case import Case
from vlmtrain.observe import run_summary

RUN_SUBDIR = "run"
POLL_S = 1.0
"""How often a running trial is looked at: its wall time (the budget's) is read when its exit is seen, so a coarser
poll counts up to that much idle GPU time per trial (5 s made every recorded trial a multiple of 5 s)."""
PARTS = (*run_summary.STARTUP_KEYS, "warmup_steps_s", "measured_steps_s")
"""A trial's wall time by part (the rest: `other_s`)."""


@dataclass(frozen=True)
class EarlyStop:
    after_steps: int = 1
    """Measured steps (after run_summary.SKIP warm-up steps) before a trial is judged."""
    slower_than: float = 0.8
    """Stop it when its useful tokens/s/GPU so far is below this fraction of the best trial's."""
    warmup: int = run_summary.SKIP
    """Steps a screening trial leaves out of its figure (finalists and the comparison: run_summary.SKIP). The first
    step compiles and the second may still wait on the loader (4.8x the steady step in a recorded run of H1's
    shapes, tests/fixtures/precision_h200), the third ran as steady ones in the recorded runs: 2 saves a screening
    trial one step."""


@dataclass
class Outcome:
    status: str
    """ok | stopped (early, a loser) | failed"""
    metrics: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    wall_s: float = 0.0
    gpus: int = 1
    run_dir: str = ""

    @property
    def useful(self) -> float | None:
        return self.metrics.get("useful_tokens_per_s_per_gpu")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Handle(Protocol):
    run_dir: Path

    def poll(self) -> int | None:
        """The exit status once the trial ended, else None."""

    def stop(self) -> None:
        """End the trial now (its losers' runs)."""

    def wall_s(self) -> float:
        """Seconds the trial has held its GPUs."""


Launch = Callable[[Path, Case], Handle]
"""(trial dir, the trial's case) -> its started handle."""


class SweepProcess:
    """`python train.py -m ... hydra.sweep.dir=<trial dir>` (vlmtrain.lab.kit.runner: its own process group, torchrun
    and the ranks with it); under hydra/launcher=slurm, stop() also cancels the Slurm jobs submitit started
    (`.submitit/<job id>`)."""

    def __init__(self, trial_dir: Path, case: Case):
        self.trial_dir, self.run_dir = trial_dir, trial_dir / RUN_SUBDIR
        self.run = runner.start(case.plus(multirun=True), trial_dir, subdir=RUN_SUBDIR, log=trial_dir / "sweep.log")

    def poll(self) -> int | None:
        return self.run.poll()

    def wall_s(self) -> float:
        return self.run.wall_s()

    def stop(self) -> None:
        jobs = [d.name for d in (self.trial_dir / ".submitit").glob("*") if d.name.split("_")[0].isdigit()]
        if jobs:
            subprocess.run(["scancel", *jobs], check=False)
        self.run.stop()


def sweep_process(trial_dir: Path, case: Case) -> Handle:
    return SweepProcess(trial_dir, case)


def slower(rows: list[dict[str, Any]], best: float | None, rule: EarlyStop) -> bool:
    """The early-stopping rule on the steps written so far."""
    if best is None or len(rows) < rule.warmup + rule.after_steps:
        return False
    useful = run_summary.summarize_rows(rows, rule.warmup).get("useful_tokens_per_s_per_gpu")
    return useful is not None and useful < rule.slower_than * best


def steps_split(rows: list[dict[str, Any]], skip: int = run_summary.SKIP) -> dict[str, float]:
    """Seconds of the steps after the first (whose time is in startup_first_step_s): the warm-up steps the summary
    leaves out, and the measured ones."""
    def total(part: list[dict[str, Any]]) -> float:
        return round(sum(r["step_s"] for r in part if isinstance(r.get("step_s"), int | float)), 2)

    return {"warmup_steps_s": total(rows[1:skip]), "measured_steps_s": total(rows[max(skip, 1):])}


def startup_s(metrics: dict[str, Any]) -> float | None:
    """A trial's startup: launcher + rank setup + first step; None where its run wrote no first row."""
    spans = [metrics.get(k) for k in run_summary.STARTUP_KEYS]
    return sum(spans) if all(isinstance(x, int | float) for x in spans) else None  # type: ignore[misc]


def spend(outcomes: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Where trials' GPU time went (Outcome.to_json() dicts): GPU-minutes per part of PARTS and `other`, the startup
    (launcher + rank setup + first step) in all, and per trial: the median startup and measured seconds. A trial
    recorded without the step split counts its steps at its median step time."""
    gpu = dict.fromkeys((*PARTS, "other_s"), 0.0)
    startups, measured = [], []
    for o in outcomes:
        m = o.get("metrics") or {}
        if "measured_steps_s" not in m and isinstance(m.get("step_s"), int | float) and m.get("steps"):
            # a trial recorded before the split: its steps at its median step time (warm-up steps run slower)
            n = m["steps"]
            m = {**m, "warmup_steps_s": max(0, min(n, run_summary.SKIP) - 1) * m["step_s"],
                 "measured_steps_s": max(0, n - run_summary.SKIP) * m["step_s"]}
        parts = {k: float(m.get(k) or 0.0) for k in PARTS}
        parts["other_s"] = max(0.0, o["wall_s"] - sum(parts.values()))
        for k, v in parts.items():
            gpu[k] += v * o["gpus"]
        if (start := startup_s(m)) is not None:
            startups.append(start)
            measured.append(parts["measured_steps_s"])
    total = sum(gpu.values())
    out: dict[str, Any] = {f"{k.removesuffix('_s')}_gpu_min": v / 60 for k, v in gpu.items()}
    out["startup_gpu_min"] = sum(gpu[k] for k in run_summary.STARTUP_KEYS) / 60
    out["startup_share"] = out["startup_gpu_min"] * 60 / total if total else None
    out["measured_share"] = gpu["measured_steps_s"] / total if total else None
    out["startup_s_median"] = statistics.median(startups) if startups else None
    out["measured_steps_s_median"] = statistics.median(measured) if measured else None
    return out


def failure_reason(run_dir: Path) -> str:
    """What vlmtrain report says about a run that did not finish (out of memory, crash line, preflight ...)."""
    from vlmtrain.report import job_from_dir

    if not run_dir.is_dir():
        log = run_dir.parent / "sweep.log"
        tail = log.read_text().strip().splitlines()[-1:] if log.is_file() else []
        return f"no run dir was written ({tail[0] if tail else 'no log'})"
    job = job_from_dir(run_dir)
    return job.reason or job.status


def run(launch: Launch, trial_dir: Path, case: Case, gpus: int, best: float | None = None,
        rule: EarlyStop | None = None, poll_s: float = POLL_S) -> Outcome:
    """Start the trial (the case as a `-m` sweep of one job on `gpus` GPUs), stop it early if it is a loser, and
    summarize its run dir (a screening trial, with a `rule`, after its warm-up)."""
    handle = launch(trial_dir, case)
    stopped = False
    while (rc := handle.poll()) is None:
        rows = run_summary.read_jsonl(handle.run_dir / "metrics.jsonl")
        if rule is not None and slower(rows, best, rule):
            handle.stop()
            stopped = True
            break
        time.sleep(poll_s)
    rows = run_summary.read_jsonl(handle.run_dir / "metrics.jsonl")
    skip = rule.warmup if rule else run_summary.SKIP
    metrics = {**run_summary.summarize_rows(rows, skip, run_summary.SUMMARY_KEYS), **steps_split(rows, skip)} \
        if rows else {}
    out = Outcome("ok", metrics, wall_s=round(handle.wall_s(), 1), gpus=gpus, run_dir=str(handle.run_dir))
    if stopped:
        assert rule is not None and best is not None
        out.status = "stopped"
        out.reason = (f"stopped after {metrics.get('steps', 0)} steps: {out.useful or 0:.0f} useful tokens/s/GPU < "
                      f"{rule.slower_than} x the best so far ({best:.0f})")
    elif rc != 0 or out.useful is None:
        out.status, out.reason = "failed", f"exit {rc}: {failure_reason(handle.run_dir)}"
    return out
