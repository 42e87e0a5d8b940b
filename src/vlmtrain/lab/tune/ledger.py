"""A search's record of its trials (`state["trials"]` of `<tune dir>/state.json`) and what decisions read off it:
a configuration's figure (the median of its finished runs), the run-to-run spread, the GPU time spent and the next
trial's expected length, and the close calls (decisions made on the medians of repeats, `state["close"]`).
"""

from __future__ import annotations

import statistics
from typing import Any

STATE = "state.json"
FINAL, COMPARE = "finalists", "compare"
"""The trials after the stages: the finalists' repeats, and the A/B pairs against a hand-found configuration."""
SPREAD_PRIOR = 0.04
"""The run-to-run spread before any configuration ran twice: whole runs of one case on one machine differ by a few
% (A/B pairs 0.957-1.040, docs/measurements.md)."""
TRIAL_FLOOR_S = 60.0
"""A trial's wall seconds before any has run: the least start-up of the measured runs (60-90 s a case on H200
nodes, docs/benchmarks.md), the steps not counted, so a budget named from it is a floor."""
USEFUL = "useful_tokens_per_s_per_gpu"
Trials = dict[str, dict[str, Any]]
"""trial id -> {stage, name, overrides, iterations, repeat, outcome (trials.Outcome.to_json())}."""


def trial_id(name: str, iterations: int, repeat: int) -> str:
    """A trial's key in state.json and its dir under trials/."""
    return f"{name}-it{iterations}-r{repeat}"


def useful(trial: dict[str, Any]) -> float | None:
    """A recorded trial's useful tokens/s/GPU where it finished, else None (failed, or stopped early)."""
    return trial["outcome"]["metrics"].get(USEFUL) if trial["outcome"]["status"] == "ok" else None


def runs_by_name(trials: Trials) -> dict[str, list[float]]:
    """Every finished run's useful tokens/s/GPU per trial name: a configuration's screening run and its repeats, a
    finalist's repeats (`final_<name>`), a side of the comparison."""
    out: dict[str, list[float]] = {}
    for t in trials.values():
        if (u := useful(t)) is not None:
            out.setdefault(t["name"], []).append(u)
    return out


def spread(trials: Trials) -> tuple[float, int]:
    """(the run-to-run spread, how many configurations measured it; 0: SPREAD_PRIOR): the median over every name
    run at least twice of (max - min) / median of its runs; the median, so that one configuration's outlier does
    not send every later decision to repeats."""
    each = [(max(v) - min(v)) / statistics.median(v) for v in runs_by_name(trials).values() if len(v) > 1]
    return (statistics.median(each), len(each)) if each else (SPREAD_PRIOR, 0)


def figure(trials: Trials, name: str, key: str = USEFUL) -> float | None:
    """The median of `key` over the finished runs of trial `name` (one screening run, or it and its repeats)."""
    done = [t["outcome"]["metrics"].get(key) for t in trials.values() if t["name"] == name and useful(t) is not None]
    done = [x for x in done if x is not None]
    return statistics.median(done) if done else None


def best(trials: Trials) -> float | None:
    return max((u for t in trials.values() if (u := useful(t)) is not None), default=None)


def spent_gpu_s(trials: Trials, compare: bool = True) -> float:
    """GPU-seconds of every trial so far (without the comparison against a hand-found configuration: not part of the
    search's budget)."""
    return sum(t["outcome"]["wall_s"] * t["outcome"]["gpus"] for t in trials.values()
               if compare or t["stage"] != COMPARE)


def estimate_s(trials: Trials) -> tuple[float, float]:
    """(the next trial's wall seconds: the longest so far; a finalist repeat's: the median), both TRIAL_FLOOR_S before
    any trial has run."""
    walls = [t["outcome"]["wall_s"] for t in trials.values()]
    return (max(walls), statistics.median(walls)) if walls else (TRIAL_FLOOR_S, TRIAL_FLOOR_S)


def close_call(state: dict[str, Any], stage: str, names: list[str], s: float, measured: int) -> dict[str, Any]:
    """The close call between `names` at `stage`: the one an earlier invocation made (its repeats resume, the spread
    it was called at kept), else a new one."""
    for call in state["close"]:
        if call["stage"] == stage and set(call["names"]) == set(names):
            call.pop("cut", None)
            return call
    call = {"stage": stage, "spread": s, "measured_from": measured, "names": names}
    state["close"].append(call)
    return call


def judge(trials: Trials, call: dict[str, Any], names: list[str]) -> None:
    """The call's runs and medians, best first, and whether the two best medians are still within the spread as
    measured after its repeats."""
    runs = runs_by_name(trials)
    call["names"], call["runs"] = names, [runs.get(n, []) for n in names]
    call["medians"] = [figure(trials, n) for n in names]
    call["decided"], call["spread_after"] = names[0], spread(trials)[0]
    call["still_close"] = (call["medians"][1] or 0) >= (call["medians"][0] or 0) * (1 - call["spread_after"])
