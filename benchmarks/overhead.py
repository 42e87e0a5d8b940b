"""Issue 9.3: what vlmtrain costs on top of Megatron Bridge, measured on the same node in one session.

    python benchmarks/overhead.py [--case SUBSTR] [--pairs 2] [--iterations 8]
    python benchmarks/overhead.py --dry-run        # CPU: build + Bridge validation of the direct side

Alternating pairs of (a) `python train.py <case>` and (b) torchrun of benchmarks/direct_pretrain.py: Bridge's
pretrain() on the IDENTICAL ConfigContainer (built by vlmtrain.build from (a)'s saved run_config.yaml), with
Bridge's forward step for the data (vlmtrain.groups.data.forward_step) and no vlmtrain callbacks. Both step times
come from Bridge's own log line ("elapsed time per iteration (ms)", log_interval=1), so the ratio is like for
like; (a)'s metrics.jsonl step_s gives a second ratio. Post-warm-up steps (iteration > skip) of all pairs are
pooled; medians, and the median of per-step ratios (both sides train the same samples in the same order). One
row `overhead_<case>` goes to results/perf_h200x2.jsonl; with --iterations 8 (perf_h200x2's), pair 0's (a) run
is also recorded there as the case's own row (it is exactly `perf_h200x2.py`'s run of that case).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import direct_pretrain  # noqa: E402
import perf_h200x2  # noqa: E402
import run_cases  # noqa: E402
from run_cases import ROOT, Case  # noqa: E402

# Steps of these runs vary ~10 % from step to step (data, alltoall waits), so a ratio meant to resolve 1 % needs
# many steady steps; at perf_h200x2.ITERATIONS, pair 0's vlmtrain run also doubles as the case's perf row.
ITERATIONS = 20
SKIP = 3  # as vlmtrain.results.summarize: metrics step s is Bridge's iteration s + 1
BRIDGE_LINE = re.compile(r"\biteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.]+)")


def bridge_step_ms(log_text: str) -> dict[int, float]:
    """Bridge's per-iteration time (ms) by iteration number (1-based) from a train.log; the last line of an
    iteration wins (Bridge logs from one rank; logs can be tails, so iterations need not start at 1)."""
    return {int(m.group(1)): float(m.group(2)) for m in map(BRIDGE_LINE.search, log_text.splitlines()) if m}


def steady(ms_by_iteration: dict[int, float], skip: int = SKIP) -> list[float]:
    return [ms for it, ms in sorted(ms_by_iteration.items()) if it > skip]


def metrics_ms(run_dir: Path, key: str = "step_s", skip: int = SKIP) -> list[float]:
    """A per-step seconds key of vlmtrain's metrics.jsonl in ms, the same steps vlmtrain.results.summarize takes."""
    from vlmtrain import results

    return [r[key] * 1000.0 for r in results.read_jsonl(run_dir / "metrics.jsonl")[skip:] if key in r]


def direct_command(run_config: Path, gpus: int, port: str) -> list[str]:
    """torchrun exactly as vlmtrain.launch.local starts vlmtrain.worker, with the direct module instead."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={gpus}", "--nnodes=1",
            "--master-port", port, str(Path(direct_pretrain.__file__).resolve()), str(run_config)]


def run_direct(run_config: Path, run_dir: Path, gpus: int) -> tuple[int, float]:
    """(b): the env vlmtrain.launch.local gives its ranks (hardware group's vars unless set) on the same GPUs."""
    from vlmtrain.groups import hardware

    run = direct_pretrain.load(run_config)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, range(gpus))), MASTER_PORT="29500")
    env.update({k: v for k, v in hardware.runtime_env(run).items() if k not in os.environ})
    env.setdefault("PYTHONUNBUFFERED", "1")
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with (run_dir / "train.log").open("w") as log:
        rc = subprocess.call(direct_command(run_config, gpus, env["MASTER_PORT"]), stdout=log,
                             stderr=subprocess.STDOUT, env=env)
    return rc, time.time() - t0


def total_ratio_ci95(a_ms: list[float], b_ms: list[float], resamples: int = 2000) -> list[float]:
    """95 % bootstrap interval of sum(a) / sum(b) over steps drawn with replacement (step i of a and b together:
    the same samples), seeded so a row recomputes to the same numbers."""
    rng = random.Random(0)
    steps = list(zip(a_ms, b_ms, strict=True))
    draws = sorted(sum(a for a, _ in d) / sum(b for _, b in d)
                   for d in ([rng.choice(steps) for _ in steps] for _ in range(resamples)))
    return [draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1]]


def overhead_metrics(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled medians over the pairs' steady steps; per-pair ratios show the spread between pairs. Both sides of a
    pair train the same samples in the same order, so step i of (a) and step i of (b) did the same work:
    `overhead_ratio_paired` is the median of those per-step ratios (data-dependent step time cancels), and
    `overhead_ratio_total` the total time of (a)'s steady steps over (b)'s (what a run costs, as vlmtrain's rates
    are total work / total time), with a bootstrap 95 % interval over the steps."""
    a_log = [ms for p in pairs for ms in p["vlmtrain_log_ms"]]
    a_met = [ms for p in pairs for ms in p["vlmtrain_metrics_ms"]]
    b_log = [ms for p in pairs for ms in p["direct_log_ms"]]
    paired = [r for p in pairs for r in p["step_ratios"]]
    host = [ms for p in pairs for ms in p.get("vlmtrain_host_ms", [])]
    med = statistics.median
    same_steps = len(a_log) == len(b_log)  # both sides logged every steady iteration
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
        "pairs": len(pairs),
        "steady_steps_per_run": min(len(p["direct_log_ms"]) for p in pairs),
        "vlmtrain_wall_s": med(p["vlmtrain_wall_s"] for p in pairs),
        "direct_wall_s": med(p["direct_wall_s"] for p in pairs),
    }


def pair_record(a_dir: Path, b_dir: Path, a_wall: float, b_wall: float, skip: int = SKIP) -> dict[str, Any]:
    """One pair's steady step times, from the files the two runs left behind, and (a)/(b) of each iteration both
    logged."""
    a_ms, b_ms = (bridge_step_ms((d / "train.log").read_text()) for d in (a_dir, b_dir))
    return {
        "vlmtrain_log_ms": steady(a_ms, skip),
        "step_ratios": [a_ms[it] / b_ms[it] for it in sorted(a_ms.keys() & b_ms.keys()) if it > skip],
        "vlmtrain_metrics_ms": metrics_ms(a_dir, "step_s", skip),
        "vlmtrain_host_ms": metrics_ms(a_dir, "vlmtrain_host_s", skip),
        "direct_log_ms": steady(b_ms, skip),
        "vlmtrain_wall_s": round(a_wall, 1),
        "direct_wall_s": round(b_wall, 1),
    }


def pick(name: str, iterations: int) -> Case:
    """The perf_h200x2 case of that exact name, else the first whose name contains it."""
    cases = [c for c, _ in perf_h200x2.expand(["all"], [name], iterations)]
    if not cases:
        raise SystemExit(f"no perf_h200x2 case matches {name!r}")
    return next((c for c in cases if c.name == name), cases[0])


def dry_run(case: Case, out: Path) -> int:
    """CPU check of side (b): save the run config as launch.local would, then load/build/validate it."""
    from vlmtrain import launch
    from vlmtrain.compose import compose

    run = compose(run_cases.overrides(case), output_dir=str(out / "vlmtrain"))
    run_config = launch.save_run_config(run)
    print("(a)", " ".join(run_cases.command(case, out / "pairN_vlmtrain")))
    print("(b)", " ".join(direct_command(run_config, case.gpus, "29500")))
    return direct_pretrain.main([str(run_config), "--dry-run"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default=perf_h200x2.B.name(), help="perf_h200x2 case name (substring)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=ITERATIONS)
    ap.add_argument("--skip", type=int, default=SKIP, help="warm-up iterations left out")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--results", type=Path, default=perf_h200x2.RESULTS)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "overhead" / time.strftime("%Y%m%d-%H%M%S"))
    args = ap.parse_args(argv)
    case = pick(args.case, args.iterations)
    print(f"[overhead] {case.name}: {args.pairs} pair(s) of {args.iterations} iterations, skip {args.skip}")
    if args.dry_run:
        return dry_run(case, args.out)
    pairs = []
    for i in range(args.pairs):
        [(_, rc, a_dir, a_wall)] = run_cases.run_batch([dataclasses.replace(case, name=f"pair{i}_vlmtrain")],
                                                       args.out, case.gpus)
        if rc:
            print((a_dir / "train.log").read_text()[-4000:], file=sys.stderr)
            return 1
        if i == 0 and args.iterations == perf_h200x2.ITERATIONS:
            run_cases.record(case, rc, a_dir, a_wall, args.results, config=run_cases.overrides(case),
                             runner=f"python benchmarks/overhead.py --case {case.name} (pair 0, vlmtrain side)")
        b_dir = args.out / f"pair{i}_direct"
        rc, b_wall = run_direct(a_dir / "run_config.yaml", b_dir, case.gpus)
        if rc:
            print((b_dir / "train.log").read_text()[-4000:], file=sys.stderr)
            return 1
        pairs.append(pair_record(a_dir, b_dir, a_wall, b_wall, args.skip))
        if not (pairs[-1]["vlmtrain_log_ms"] and pairs[-1]["direct_log_ms"]):
            print(f"[overhead] pair {i}: no Bridge step line after iteration {args.skip} in {a_dir} or {b_dir}",
                  file=sys.stderr)
            return 1
        print(f"[overhead] pair {i}: {overhead_metrics(pairs[-1:])}", flush=True)
    from vlmtrain import results

    metrics = overhead_metrics(pairs)
    cmd = f"python benchmarks/overhead.py --case {case.name} --pairs {args.pairs} --iterations {args.iterations}"
    results.append(args.results, f"overhead_{case.name}", cmd, metrics, config=run_cases.overrides(case),
                   direct=" ".join(direct_command(Path("<run dir>/run_config.yaml"), case.gpus, "29500")),
                   pairs_detail=pairs)
    print(f"[overhead] {metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
