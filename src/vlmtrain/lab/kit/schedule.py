"""The schedule of repeated runs: the (case, run) pairs the cases still need on this machine run (vlmtrain.lab.kit.store
says what one is), run under a time budget, and each case's summary row once its last run landed: the median and the
min-max spread of each headline metric over the runs (never the best of them), so a claim carries its run-to-run
spread.

A run row is a results row with `machine_run` and `run` (its number within the machine run); the case's summary row
is `<case>_summary` with the same `machine_run`, `case` and `runs`. Runs already recorded for a machine run are not
run again, so a case's repeats may be split over several invocations on one machine. `add_flags` declares the
flags every experiment that repeats runs takes (--repeats, --budget-s, --machine-run).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlmtrain.lab.kit import experiments, store
from vlmtrain.lab.kit.case import Case

KEYS = ("useful_tokens_per_s_per_gpu", "mfu", "step_s", "peak_mem_gib", "mfu_vit", "mfu_projector", "mfu_decoder")
"""What a summary row gives the median and min/max of (a key is left out unless every run has it)."""
SUMMARY_SUFFIX = "_summary"
USEFUL = "useful_tokens_per_s_per_gpu"


def add_flags(ap: argparse.ArgumentParser, repeats: int | None, what: str = "case", tag: bool = True) -> None:
    """--repeats (default `repeats`; None: the experiment's own), --budget-s and, unless the experiment declares its
    own, --machine-run."""
    ap.add_argument("--repeats", type=int, default=repeats, help=f"runs per {what} on this machine run, then a median "
                    "row; runs the machine run already recorded are not run again")
    ap.add_argument("--budget-s", type=float, default=None, help="start no run that would end after this many "
                    "seconds (estimate: the slowest run so far), so a time-limited GPU session loses no half run")
    if tag:
        experiments.add_machine_run(ap)


def runs(rows: list[dict[str, Any]], name: str, machine_run: str) -> list[dict[str, Any]]:
    """The finished (rc 0, measured) run rows of case `name` on `machine_run`, in order."""
    return [r for r in rows if r["name"] == name and r.get("machine_run") == machine_run and "run" in r
            and not r.get("rc") and USEFUL in r["metrics"] and "superseded" not in r]


def done(path: Path, name: str, machine_run: str) -> int:
    """How many runs of `name` this machine run has recorded in the results file."""
    return len(runs(store.read(path), name, machine_run))


def pending(cases: list[Case], repeats: int, have: Callable[[Case], int], tag: str,
            machine_run: str) -> list[tuple[Case, int]]:
    """(case, run number) still to run on this machine run: each case's runs from `have(case)` (those it recorded)
    up to `repeats`. Runs alternate between cases (every case's run 1, then run 2, ...): drift on the machine run
    touches each case alike, and a budget cut leaves every case with about as many runs."""
    todo = []
    for case in cases:
        n = have(case)
        if n:
            print(f"[{tag}] {case.name}: {n} of {repeats} runs already recorded on {machine_run}", flush=True)
        todo += [(case, i) for i in range(n, repeats)]
    return sorted(todo, key=lambda t: t[1])


def run(todo: list[tuple[Case, int]], measure: Callable[[Case, int], bool], *, repeats: int, tag: str,
        machine_run: str, budget_s: float | None = None, first_s: float | None = None,
        after_last: Callable[[Case], object] | None = None) -> set[str]:
    """Each (case, run) of `todo` in order through `measure` (True: its row landed), then `after_last(case)` once a
    case's run `repeats` landed (its summary row). A case that failed is not run again in this call; no run starts
    that would end after `budget_s` (estimate: the slowest run so far; before the first, `first_s`, or none: the
    first always starts). The names of the cases that failed."""
    failed: set[str] = set()
    t0, walls = time.monotonic(), []
    for k, (case, i) in enumerate(todo):
        if case.name in failed:
            continue
        estimate = max(walls, default=first_s)
        if budget_s is not None and estimate is not None and time.monotonic() - t0 + estimate > budget_s:
            print(f"[{tag}] budget: {budget_s:.0f} s would be exceeded; not started: "
                  f"{', '.join(f'{c.name} run {j + 1}/{repeats}' for c, j in todo[k:])}", flush=True)
            break
        print(f"[{tag}] {case.name}" + (f" run {i + 1}/{repeats} ({machine_run})" if repeats > 1 else ""), flush=True)
        started = time.monotonic()
        ok = measure(case, i)
        walls.append(time.monotonic() - started)
        if not ok:
            failed.add(case.name)
        elif after_last is not None and i + 1 == repeats:
            after_last(case)
    return failed


def spread(values: list[float], key: str) -> dict[str, float]:
    return {key: statistics.median(values), f"{key}_min": min(values), f"{key}_max": max(values)}


def summary_metrics(run_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and min/max of KEYS over the runs (a key every run has), and `runs`."""
    out: dict[str, Any] = {"runs": len(run_rows)}
    for key in KEYS:
        values = [r["metrics"].get(key) for r in run_rows]
        if values and all(isinstance(v, int | float) for v in values):
            out |= spread(values, key)
    return out


def summary(path: Path, name: str, machine_run: str, command: str,
            then: Callable[[str], object] | None = None, **extra: Any) -> dict[str, Any] | None:
    """The summary row of `name` on `machine_run` from its recorded runs (None when it has none), then `then(name)`
    (a row derived from it: vlmtrain.lab.vs_bridge's peer ratio)."""
    mine = runs(store.read(path), name, machine_run)
    if not mine:
        return None
    metrics = summary_metrics(mine)
    row = store.append(path, name + SUMMARY_SUFFIX, command, metrics, machine_run=machine_run, case=name,
                       machine=mine[-1].get("machine", store.machine()), config=mine[-1].get("config"), **extra)
    lo, hi = metrics[USEFUL + "_min"], metrics[USEFUL + "_max"]
    print(f"[repeats] {name} ({machine_run}, {metrics['runs']} runs): median {metrics[USEFUL]:.0f} useful "
          f"tokens/s/GPU ({lo:.0f}-{hi:.0f}), step {metrics['step_s']:.2f} s", flush=True)
    if then is not None:
        then(name)
    return row


def summaries(rows: list[dict[str, Any]], machine_run: str) -> dict[str, dict[str, Any]]:
    """The latest summary row of each case on `machine_run`, by case name."""
    return {r["case"]: r for r in rows if r["name"].endswith(SUMMARY_SUFFIX) and r.get("machine_run") == machine_run
            and "case" in r and USEFUL in r["metrics"]}
