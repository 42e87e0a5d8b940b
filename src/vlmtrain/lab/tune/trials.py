"""One trial: `python train.py -m <overrides>` (the path every `-m` sweep takes: the sweeper's preflight for the world
it will run on, its launcher, local GPUs or Slurm through `hydra/launcher=slurm`), watched while it runs.

A trial is a sweep of one job in `<trial dir>` (its run dir `<trial dir>/run`, with metrics.jsonl). Its outcome is
vlmtrain's own summary of that run dir (vlmtrain.observe.run_summary.summarize). A trial whose first measured steps run
slower than `slower_than` x the best so far is stopped there (early stopping), its partial summary kept.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vlmtrain.lab import runner
from vlmtrain.observe import run_summary

RUN_SUBDIR = "run"
POLL_S = 5.0


@dataclass(frozen=True)
class EarlyStop:
    after_steps: int = 1
    """Measured steps (after run_summary.SKIP warm-up steps) before a trial is judged."""
    slower_than: float = 0.8
    """Stop it when its useful tokens/s/GPU so far is below this fraction of the best trial's."""


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


Launch = Callable[[Path, list[str]], Handle]
"""(trial dir, every override of the trial) -> its started handle."""


class SweepProcess:
    """`python train.py -m ... hydra.sweep.dir=<trial dir>` (vlmtrain.lab.runner: its own process group, torchrun and
    the ranks with it); under hydra/launcher=slurm, stop() also cancels the Slurm jobs submitit started
    (`.submitit/<job id>`)."""

    def __init__(self, trial_dir: Path, overrides: list[str]):
        self.trial_dir, self.run_dir = trial_dir, trial_dir / RUN_SUBDIR
        self.run = runner.start(overrides, trial_dir, multirun=True, subdir=RUN_SUBDIR, log=trial_dir / "sweep.log")

    def poll(self) -> int | None:
        return self.run.poll()

    def wall_s(self) -> float:
        return self.run.wall_s()

    def stop(self) -> None:
        jobs = [d.name for d in (self.trial_dir / ".submitit").glob("*") if d.name.split("_")[0].isdigit()]
        if jobs:
            subprocess.run(["scancel", *jobs], check=False)
        self.run.stop()


def sweep_process(trial_dir: Path, overrides: list[str]) -> Handle:
    return SweepProcess(trial_dir, overrides)


def slower(rows: list[dict[str, Any]], best: float | None, rule: EarlyStop) -> bool:
    """The early-stopping rule on the steps written so far."""
    if best is None or len(rows) < run_summary.SKIP + rule.after_steps:
        return False
    useful = run_summary.summarize_rows(rows).get("useful_tokens_per_s_per_gpu")
    return useful is not None and useful < rule.slower_than * best


def failure_reason(run_dir: Path) -> str:
    """What vlmtrain report says about a run that did not finish (out of memory, crash line, preflight ...)."""
    from vlmtrain.report import job_from_dir

    if not run_dir.is_dir():
        log = run_dir.parent / "sweep.log"
        tail = log.read_text().strip().splitlines()[-1:] if log.is_file() else []
        return f"no run dir was written ({tail[0] if tail else 'no log'})"
    job = job_from_dir(run_dir)
    return job.reason or job.status


def run(launch: Launch, trial_dir: Path, overrides: list[str], gpus: int, best: float | None = None,
        rule: EarlyStop | None = None, poll_s: float = POLL_S) -> Outcome:
    """Start the trial, stop it early if it is a loser, and summarize its run dir."""
    handle = launch(trial_dir, overrides)
    stopped = False
    while (rc := handle.poll()) is None:
        rows = run_summary.read_jsonl(handle.run_dir / "metrics.jsonl")
        if rule is not None and slower(rows, best, rule):
            handle.stop()
            stopped = True
            break
        time.sleep(poll_s)
    metrics = run_summary.summarize(handle.run_dir, keys=run_summary.SUMMARY_KEYS) if handle.run_dir.is_dir() else {}
    out = Outcome("ok", metrics, wall_s=round(handle.wall_s(), 1), gpus=gpus, run_dir=str(handle.run_dir))
    if stopped:
        assert rule is not None and best is not None
        out.status = "stopped"
        out.reason = (f"stopped after {metrics.get('steps', 0)} steps: {out.useful or 0:.0f} useful tokens/s/GPU < "
                      f"{rule.slower_than} x the best so far ({best:.0f})")
    elif rc != 0 or out.useful is None:
        out.status, out.reason = "failed", f"exit {rc}: {failure_reason(handle.run_dir)}"
    return out
