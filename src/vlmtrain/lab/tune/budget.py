"""What a search may spend and why it stops: the GPU-minute budget (every invocation's trials) and this invocation's
wall-clock limit, checked before each trial (`room`); before anything runs, the least budget that holds the first
stage and the finalists (`first_stage`); and every invocation's end in words, with what the same command does next
(`end`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from vlmtrain.lab.tune.ledger import COMPARE, FINAL, TRIAL_FLOOR_S, Trials, estimate_s, spent_gpu_s

WALL_MARGIN_S = 60.0
"""What a --max-wall-min named to fit the next trial adds to it: the invocation's own composing and pruning."""


def gpu_min(gpu_s: float) -> str:
    """GPU-seconds as the GPU-minutes a user would pass, rounded up to a tenth."""
    return f"{math.ceil(gpu_s / 6 - 1e-9) / 10:g}"


class OutOfTime(Exception):
    """No room for the next trial. `kind`: budget (final: the search goes on to what comes after the budget), wall
    (this invocation's --max-wall-min: resume later), wall_short (the next trial is longer than --max-wall-min
    itself), too_small (before anything ran: the budget cannot hold the first stage and the finalists), plan
    (--plan runs nothing). `least`: the budget's GPU-seconds or wall seconds that would have held it."""

    def __init__(self, kind: str, why: str, stage: str, trial: str = "", least: float | None = None):
        super().__init__(why)
        self.kind, self.stage, self.trial, self.least = kind, stage, trial, least

    @property
    def final(self) -> bool:
        return self.kind == "budget"


def room(stage: str, name: str, trials: Trials, *, gpus: int, finalist_trials: int, budget_gpu_s: float | None,
         max_wall_s: float | None, started: float, plan: bool) -> None:
    """Raise OutOfTime when the next trial would not fit: in the budget, where a stage's trial also leaves room for
    every finalist repeat (repeats already run count as spent, since a new stage trial can change the finalists: a
    resumed search whose finalists ran does not reopen the stages the budget ended), or in this invocation's wall
    time (`started`: its monotonic start)."""
    need, typical = estimate_s(trials)
    if plan:
        raise OutOfTime("plan", "--plan: candidates pruned, nothing run", stage, name)
    spent = spent_gpu_s(trials, compare=False)
    reserve = 0.0 if stage in (FINAL, COMPARE) else finalist_trials * typical * gpus
    if stage != COMPARE and budget_gpu_s is not None and spent + need * gpus + reserve > budget_gpu_s:
        held = f" and ~{reserve / 60:.1f} are held for the finalists' repeats" if reserve else ""
        raise OutOfTime("budget", f"{spent / 60:.1f} of {budget_gpu_s / 60:g} GPU-min spent, the next trial ({name}) "
                        f"needs ~{need * gpus / 60:.1f}{held}", stage, name, spent + need * gpus + reserve)
    if max_wall_s is None:
        return
    if need > max_wall_s:
        raise OutOfTime("wall_short", f"the next trial ({name}) takes ~{need / 60:.1f} min (the longest so far), "
                        f"longer than --max-wall-min {max_wall_s / 60:g} itself", stage, name, need + WALL_MARGIN_S)
    gone = time.monotonic() - started
    if gone + need > max_wall_s:
        raise OutOfTime("wall", f"{gone / 60:.1f} of --max-wall-min {max_wall_s / 60:g} gone, the next trial ({name}) "
                        f"takes ~{need / 60:.1f} min", stage, name, need)


def first_stage(state: dict[str, Any], stage: str, trials: int, candidates: int, finalist_trials: int, gpus: int,
                ladder: bool, budget_gpu_s: float | None) -> None:
    """Before anything ran: the least budget that holds the first stage's `trials` and the finalists' repeats, each
    trial at TRIAL_FLOOR_S x its GPUs (kept as state["least_budget"]); a smaller --budget-gpu-min ends the search
    here, nothing spent."""
    each = TRIAL_FLOOR_S * gpus
    least = (trials + finalist_trials) * each
    state["least_budget"] = {"stage": stage, "trials": trials, "candidates": candidates,
                             "finalist_trials": finalist_trials, "trial_gpu_s": each, "gpu_s": least}
    if budget_gpu_s is not None and budget_gpu_s < least:
        raise OutOfTime("too_small", f"--budget-gpu-min {budget_gpu_s / 60:g} cannot hold the first stage and the "
                        f"finalists: the {stage} stage runs at least {trials} of its {candidates} candidates"
                        f"{' (each ladder its first two rungs)' * ladder}, the finalists {finalist_trials} repeats, "
                        f"and before any trial has run one is taken to cost ~{each / 60:.1f} GPU-min "
                        f"({TRIAL_FLOOR_S:.0f} s of start-up x {gpus} GPU(s), the steps not counted)", stage,
                        least=least)


def ended(e: OutOfTime, stages: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the budget ended the stages or the finalists (an entry of state["budget"])."""
    ran = {"ran": len(stages[-1]["ran"])} if e.stage != FINAL and stages else {}
    return {"stage": e.stage, "why": f"budget: {e}", "least_gpu_s": e.least, **ran}


def part(stage: str) -> str:
    """A stage, the finalists or the comparison, in words."""
    return {FINAL: "the finalists' repeats", COMPARE: "the comparison with --versus"}.get(stage, f"the {stage} stage")


def end(stop: OutOfTime | None, state: dict[str, Any], ran_now: int) -> dict[str, Any]:
    """Why this invocation stopped (`reason`: done, wall, wall_short, too_small, plan) and what the same command does
    next, in words for the terminal and the report."""
    if stop is None:
        budget = state["budget"]
        why = "done: every stage ran, then the finalists' repeats" if state.get("winner") else \
            "done: no trial finished (the trials' reasons are in the report)"
        nxt = "nothing left to do: the same command runs no trial and exits 0"
        if budget:
            parts = [(part(b["stage"]), b) for b in budget]
            why = "done within the budget, which ended " + " and ".join(p for p, _ in parts)
            nxt += "; --budget-gpu-min " + ", ".join(f"{gpu_min(b['least_gpu_s'])} or more resumes {p}"
                                                     for p, b in reversed(parts))
        if not ran_now and state["trials"]:
            why = f"nothing left to do (no trial ran now): {why}"
        return {"reason": "done", "why": why, "next": nxt, "ran_now": ran_now}
    where = part(stop.stage)
    if stop.kind == "wall":
        why, nxt = f"paused: {stop}", f"the same command resumes at {where} ({stop.trial})"
    elif stop.kind == "wall_short":
        why = f"stopped: {stop}"
        nxt = (f"the same command would run nothing: give --max-wall-min {math.ceil(stop.least / 30) / 2:g} or "
               f"more (or leave it out) to run {where}")
    elif stop.kind == "too_small":
        why = f"nothing ran: {stop}"
        nxt = f"the same command runs nothing again: give --budget-gpu-min {gpu_min(stop.least or 0)} or more"
    else:
        least = state.get("least_budget")
        why = "--plan: the first stages' candidates are pruned, nothing ran"
        nxt = f"without --plan the search starts at {where}" + (
            f"; the budget must hold at least ~{gpu_min(least['gpu_s'])} GPU-min for its first stage and the "
            "finalists" if least else "")
    return {"reason": stop.kind, "why": why, "next": nxt, "ran_now": ran_now}
