"""What vlmtrain costs on top of Megatron Bridge, measured in pairs on the same node: the measurement (step times
from Bridge's own log lines, pairs, ratios and their intervals) and side (b), Bridge's pretrain() on the identical
ConfigContainer. The command that runs the pairs is `vlmtrain overhead` (vlmtrain.lab.overhead_ab).

(b) runs in its own directory: its run_config.yaml is (a)'s with only `output_dir` changed, so what Bridge writes
there does not land in (a)'s (with train.profile_step=N: the profiler's trace, summarized per side into the pair's
`profile`; iterations N-1..N+1 leave the ratios). Both step times come from Bridge's own log line ("elapsed time per
iteration (ms)", log_interval=1), so the ratio is like for like; (a)'s metrics.jsonl step_s gives a second ratio.
Runs of one case differ by a few % from run to run, more than steps average out within a run, so the interval that
decides a 1 % bound is the one over pairs (`overhead_ratio_pairs_ci95`).
"""

from __future__ import annotations

import math
import random
import re
import shutil
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vlmtrain.lab.kit import runner

BRIDGE_ALONE = "vlmtrain.lab.bridge_alone"
"""The torchrun module of side (b)."""

# Steps of these runs vary ~10 % from step to step (data, alltoall waits), so a ratio meant to resolve 1 % needs
# many steady steps; at the sweep spec's iterations, pair 0's vlmtrain run also doubles as the case's row.
ITERATIONS = 20
SKIP = 3  # as vlmtrain.observe.run_summary.summarize: metrics step s is Bridge's iteration s + 1
BRIDGE_LINE = re.compile(r"\biteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.]+)")


def bridge_step_ms(log_text: str) -> dict[int, float]:
    """Bridge's per-iteration time (ms) by iteration number (1-based) from a train.log; the last line of an
    iteration wins (Bridge logs from one rank; logs can be tails, so iterations need not start at 1)."""
    return {int(m.group(1)): float(m.group(2)) for m in map(BRIDGE_LINE.search, log_text.splitlines()) if m}


def steady(ms_by_iteration: dict[int, float], skip: int = SKIP, left_out: frozenset[int] = frozenset()) -> list[float]:
    return [ms for it, ms in sorted(ms_by_iteration.items()) if it > skip and it not in left_out]


def metrics_ms(run_dir: Path, key: str = "step_s", skip: int = SKIP,
               left_out: frozenset[int] = frozenset()) -> list[float]:
    """A per-step seconds key of vlmtrain's metrics.jsonl in ms, the same steps run_summary.summarize takes
    (step s is Bridge's iteration s + 1)."""
    from vlmtrain.observe import run_summary

    rows = run_summary.read_jsonl(run_dir / "metrics.jsonl")[skip:]
    return [r[key] * 1000.0 for r in rows if key in r and r["step"] + 1 not in left_out]


def profiled_iterations(overrides: list[str]) -> frozenset[int]:
    """Bridge iterations whose logged interval holds profiler work besides a plain step (train.profile_step=N:
    the profiler's start before N, the traced step N, writing the trace in N + 1's interval, ~12 s on the tiny
    model); both sides leave them out of the ratios."""
    n = next((int(o.split("=", 1)[1]) for o in overrides if o.startswith("train.profile_step=")), None)
    return frozenset() if n is None else frozenset({n - 1, n, n + 1})


PORT = "29500"
"""(b)'s MASTER_PORT: its runs never share the node with another."""


def direct_command(run_config: Path, gpus: int, port: str) -> list[str]:
    """torchrun exactly as vlmtrain.launch.local starts vlmtrain.worker, with the direct module instead."""
    from vlmtrain.launch import local

    return local.torchrun(BRIDGE_ALONE, [str(run_config)], gpus, 1, port)


def direct_run_config(source: Path, run_dir: Path) -> Path:
    """(a)'s saved run config with `output_dir` = (b)'s run dir, written there (secrets stay `${oc.env:...}`), and
    next to it (a)'s run.json, the values (a) resolved."""
    from omegaconf import OmegaConf

    from vlmtrain.config.resolve import RUN_JSON

    tree = OmegaConf.load(source)
    tree.output_dir = str(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(tree, run_dir / "run_config.yaml")
    shutil.copyfile(source.parent / RUN_JSON, run_dir / RUN_JSON)
    return run_dir / "run_config.yaml"


def run_direct(source: Path, run_dir: Path, gpus: int) -> tuple[int, float]:
    """(b) on (a)'s run config (direct_run_config), with the env vars (a) resolved, as vlmtrain.launch.local gives
    its ranks (unless set here), on the same GPUs."""
    from vlmtrain.launch import local

    run_config = direct_run_config(source, run_dir)
    env = local.rank_env(local.loaded(run_config)[1])
    run = runner.spawn(direct_command(run_config, gpus, PORT), run_dir, env=env, gpus=range(gpus), port=int(PORT))
    return run.wait(), run.wall_s()


# 97.5 % quantiles of Student's t by degrees of freedom (scipy.stats.t.ppf(0.975, df), as a table so that the GPU
# side needs no scipy); beyond 15 the value at 15 (a slightly wider interval)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131}


def pairs_ci95(ratios: list[float]) -> list[float] | None:
    """95 % t interval of the typical pair ratio (geometric mean, so a ratio and its inverse weigh the same): pairs
    are the independent repeats, steps within a run are not."""
    if len(ratios) < 2:
        return None
    logs = [math.log(r) for r in ratios]
    half = T975[min(len(logs) - 1, max(T975))] * statistics.stdev(logs) / math.sqrt(len(logs))
    mid = statistics.fmean(logs)
    return [math.exp(mid - half), math.exp(mid + half)]


def total_ratio_ci95(a_ms: list[float], b_ms: list[float], resamples: int = 2000) -> list[float]:
    """95 % bootstrap interval of sum(a) / sum(b) over steps drawn with replacement (step i of a and b together:
    the same samples), seeded so a row recomputes to the same numbers."""
    rng = random.Random(0)
    steps = list(zip(a_ms, b_ms, strict=True))
    draws = sorted(sum(a for a, _ in d) / sum(b for _, b in d)
                   for d in ([rng.choice(steps) for _ in steps] for _ in range(resamples)))
    return [draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1]]


def _median_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def overhead_metrics(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled medians over the pairs' steady steps; per-pair ratios show the spread between pairs. Both sides of a
    pair train the same samples in the same order, so step i of (a) and step i of (b) did the same work:
    `overhead_ratio_paired` is the median of those per-step ratios (data-dependent step time cancels), and
    `overhead_ratio_total` the total time of (a)'s steady steps over (b)'s (what a run costs, as vlmtrain's rates
    are total work / total time), with a bootstrap 95 % interval over the steps; `pair_total_ratios` the same per
    pair, and `overhead_ratio_pairs` their geometric mean with its t interval over pairs."""
    a_log = [ms for p in pairs for ms in p["vlmtrain_log_ms"]]
    a_met = [ms for p in pairs for ms in p["vlmtrain_metrics_ms"]]
    b_log = [ms for p in pairs for ms in p["direct_log_ms"]]
    paired = [r for p in pairs for r in p["step_ratios"]]
    host = [ms for p in pairs for ms in p.get("vlmtrain_host_ms", [])]
    med = statistics.median
    same_steps = len(a_log) == len(b_log)  # both sides logged every steady iteration
    per_pair = [sum(p["vlmtrain_log_ms"]) / sum(p["direct_log_ms"]) for p in pairs]
    return {
        "overhead_ratio": med(a_log) / med(b_log),
        "overhead_ratio_total": sum(a_log) / sum(b_log) if same_steps else None,
        "overhead_ratio_total_ci95": total_ratio_ci95(a_log, b_log) if same_steps else None,
        "overhead_ratio_paired": med(paired),
        "paired_ratio_quartiles": statistics.quantiles(paired, n=4) if len(paired) > 1 else paired,
        "overhead_ratio_metrics": med(a_met) / med(b_log) if a_met else None,
        # vlmtrain's own host code per step (metrics.jsonl vlmtrain_host_s) over (b)'s step: the part of the
        # overhead that does not drown in step-to-step noise
        "vlmtrain_host_ms": med(host) if host else None,
        "vlmtrain_host_fraction": med(host) / med(b_log) if host else None,
        "vlmtrain_step_ms_bridge_log": med(a_log),
        "vlmtrain_step_ms_metrics": med(a_met) if a_met else None,
        "direct_step_ms_bridge_log": med(b_log),
        "pair_ratios": [med(p["vlmtrain_log_ms"]) / med(p["direct_log_ms"]) for p in pairs],
        "pair_total_ratios": per_pair,
        "overhead_ratio_pairs": statistics.geometric_mean(per_pair),
        "overhead_ratio_pairs_ci95": pairs_ci95(per_pair),
        "pair_orders": [p.get("order", "vlmtrain,direct") for p in pairs],
        "pairs": len(pairs),
        "steady_steps_per_run": min(len(p["direct_log_ms"]) for p in pairs),
        # a pair rebuilt from its run dirs has no walls
        "vlmtrain_wall_s": _median_known(p["vlmtrain_wall_s"] for p in pairs),
        "direct_wall_s": _median_known(p["direct_wall_s"] for p in pairs),
    }


# what a pair keeps of each side's profile summary (the whole summary is profile_summary.json in its run dir)
PROFILE_KEYS = ("window_ms", "gpu_busy_ms", "idle_gaps_ms", "kernel_ms_by_family", "idle_ms_by_python_site")


ProfileSummary = Callable[[Path], "dict[str, Any] | None"]
"""A run dir -> its traced step's summary, None when it traced none (vlmtrain overhead perf_h200x2 passes
vlmtrain.report.profile's: report comes after observe, so this module does not import it)."""


def pair_record(a_dir: Path, b_dir: Path, a_wall: float, b_wall: float, skip: int = SKIP,
                order: str = "vlmtrain,direct", left_out: frozenset[int] = frozenset(),
                profile_summary: ProfileSummary | None = None) -> dict[str, Any]:
    """One pair's steady step times (iterations after `skip`, but not those `left_out`), from the files the two runs
    left behind, and (a)/(b) of each iteration both logged; `order` says which ran first; `profile`: each side's
    profiled step where the runs traced one (read by `profile_summary`)."""
    a_ms, b_ms = (bridge_step_ms((d / "train.log").read_text()) for d in (a_dir, b_dir))
    summaries = {side: profile_summary(d) if profile_summary else None
                 for side, d in (("vlmtrain", a_dir), ("direct", b_dir))}
    traced = {side: sm for side, sm in summaries.items() if sm is not None}
    return {
        "vlmtrain_log_ms": steady(a_ms, skip, left_out),
        "step_ratios": [a_ms[it] / b_ms[it] for it in sorted(a_ms.keys() & b_ms.keys())
                        if it > skip and it not in left_out],
        "vlmtrain_metrics_ms": metrics_ms(a_dir, "step_s", skip, left_out),
        "vlmtrain_host_ms": metrics_ms(a_dir, "vlmtrain_host_s", skip, left_out),
        "direct_log_ms": steady(b_ms, skip, left_out),
        "vlmtrain_wall_s": round(a_wall, 1),
        "direct_wall_s": round(b_wall, 1),
        "order": order,
        **({"left_out_iterations": sorted(left_out)} if left_out else {}),
        **({"profile": {side: {k: v for k, v in sm.items() if k in PROFILE_KEYS} for side, sm in traced.items()}}
           if traced else {}),
    }
