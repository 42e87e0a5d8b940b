"""Where one steady training step's GPU time goes in a case of a sweep spec (conf/tune/): the case with
`train.profile_step` (Bridge's PyTorch profiler on that step, rank 0), summarized by vlmtrain.report.profile, one
row in results/profile_<spec without perf_>.jsonl (perf_h200x2 -> profile_h200x2).

    vlmtrain lab profile-step [--spec perf_h200x2] [--case NAME] [--step 5] [--extra OVERRIDE ...] [--ab N]
    vlmtrain profile <run dir or trace>      # the summary alone, of any run started with train.profile_step=N

`--ab N` also runs the case without the profiler, alternating with the profiled run, N pairs: each profiled row then
says how much the profiler stretched its step and the others (`profiled_step_ratio`, `other_steps_ratio`: against
the median steady step of the unprofiled run before it), so a summary is read knowing what the profiler added.
Bridge's profiler records iteration `profile_step` counted from 1: metrics.jsonl's step `profile_step - 1`.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from vlmtrain.lab.kit import experiments, runner, spec, store
from vlmtrain.lab.kit.case import Case
from vlmtrain.lab.kit.runner import ROOT
from vlmtrain.observe import run_summary
from vlmtrain.report import profile


def profile_case(case: Case, step: int) -> Case:
    """The case plus `train.profile_step` (two more iterations, so the profiled one is not the last)."""
    kept = [o for o in case.overrides if not o.startswith("train.iterations=")]
    extra = [f"train.iterations={step + 2}", f"train.profile_step={step}"]
    return Case(f"profile_{case.name}", case.gpus, [*kept, *extra], dry_run=False)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--spec", default="perf_h200x2", help="the sweep spec the case comes from (conf/tune/<spec>.yaml)")
    ap.add_argument("--case", default=None, help="a case name of the spec (any sweep); default: its `best` entry, "
                    "else its first case")
    ap.add_argument("--step", type=int, default=5, help="the profiled iteration (after warm-up)")
    ap.add_argument("--extra", nargs="*", default=[], help="overrides added to the case (e.g. what a fix changes, "
                    "or train.profile_stacks=true)")
    ap.add_argument("--ab", type=int, default=0, metavar="N",
                    help="N pairs: the case unprofiled, then profiled, each pair's profiled row with the stretch")
    experiments.add_results(ap, None, "results/profile_<spec without perf_>.jsonl")
    experiments.add_out(ap, "profile")


def stretch(profiled: Path, plain: Path, step: int) -> dict[str, float]:
    """The profiled run's recorded step (metrics step `step - 1`) and its other steady steps against the unprofiled
    run's median steady step."""
    rows = run_summary.read_jsonl(profiled / "metrics.jsonl")
    base = statistics.median(r["step_s"] for r in run_summary.steady(run_summary.read_jsonl(plain / "metrics.jsonl")))
    recorded = next(r["step_s"] for r in rows if r["step"] == step - 1)
    others = statistics.median(r["step_s"] for r in run_summary.steady(rows) if r["step"] != step - 1)
    return {"unprofiled_step_s": base, "profiled_step_s": recorded, "other_steps_s": others,
            "profiled_step_ratio": recorded / base, "other_steps_ratio": others / base}


def run(args: argparse.Namespace) -> int:
    perf = spec.load(args.spec)
    expanded = perf.expand(["all"], iterations=int(perf.get("iterations")))
    cases = {c.name: c for c in expanded}
    args.case = args.case or (perf.name_of(perf.get("best")) if perf.get("best") else expanded[0].name)
    args.results = args.results or ROOT / "results" / f"profile_{args.spec.removeprefix('perf_')}.jsonl"
    if args.case not in cases:
        print(f"unknown case {args.case!r}; see vlmtrain sweep {args.spec} --sweep all --list", file=sys.stderr)
        return 2
    base = cases[args.case]
    case = profile_case(base.plus(*args.extra), args.step)
    plain = dataclasses.replace(case, name=f"unprofiled_{base.name}",  # the same iterations, no profiler
                                overrides=[o for o in case.overrides if not o.startswith("train.profile_step=")])
    for pair in range(max(args.ab, 1)):
        extra: dict[str, Any] = {}
        out = args.out / f"pair{pair}" if args.ab else args.out
        if args.ab:
            ((_, rc, plain_dir, _),) = runner.side_by_side([plain], out)
            if rc != 0:
                print(f"[profile] {plain.name} failed rc={rc}; see {plain_dir / 'train.log'}", flush=True)
                return rc
        t0 = time.time()
        ((_, rc, run_dir, _),) = runner.side_by_side([case], out)
        if rc != 0:
            print(f"[profile] {case.name} failed rc={rc}; see {run_dir / 'train.log'}", flush=True)
            return rc
        s = profile.summarize(run_dir)
        print(profile.render(s), flush=True)
        metrics = {k: s[k] for k in ("window_ms", "gpu_busy_ms", "gpu_busy_fraction", "idle_gaps_ms")}
        metrics.update({f"kernel_ms_{k.replace('/', '_')}": v for k, v in s["kernel_ms_by_family"].items()})
        # the run's median step; its rates are left out: the profiled step includes writing the trace
        metrics.update({k: v for k, v in run_summary.summarize(run_dir).items() if k in ("step_s", "peak_mem_gib")})
        if args.ab:
            metrics |= stretch(run_dir, plain_dir, args.step)
            extra = {"pair": pair, "unprofiled_config": plain.command_line()}
            print(f"[profile] pair {pair}: profiled step {metrics['profiled_step_ratio']:.2f}x, other steps "
                  f"{metrics['other_steps_ratio']:.2f}x the unprofiled run's", flush=True)
        store.append(args.results, case.name, experiments.typed(args), metrics, config=case.command_line(),
                     wall_s=round(time.time() - t0, 1), sites_from=s["sites_from"], **extra,
                     **{k: s[k] for k in ("top_kernels_ms", "kernel_ms_by_python_site", "idle_ms_by_python_site")})
    return 0
