"""`vlmtrain sweep <spec>`: the named sweeps of a spec (conf/tune/perf_h200x2.yaml: the 2 x H200 benchmark), one
case after another through the trial runner (`python train.py -m`, as `vlmtrain tune` runs its trials), one row per
case in the spec's results file (vlmtrain.observe.run_summary; metrics from summarize, the full override list as
`config`); `--report` writes <results>.md from that file alone. With `--repeats N` (default: the spec's `repeats`, else
1) each case runs until this machine run has N finished runs of it (one row each, with `machine_run` and `run`;
runs already recorded for the machine run are skipped, so repeats may span invocations), then its summary row:
median and min-max (vlmtrain.lab.kit.schedule; a benchmark's peer ratio after it, vlmtrain.lab.vs_bridge).

    vlmtrain sweep perf_h200x2 --sweep mbs parallelism [--only SUBSTR ...] [--iterations 8]
    vlmtrain sweep perf_h200 --sweep h1 [--repeats 3] [--budget-s 600]   # one H200: 3 runs per case, then medians
    vlmtrain sweep perf_h200x2 --sweep all --dry-run     # CPU: preflight + Bridge validation of every case
    vlmtrain sweep perf_h200x2 --sweep all --list        # the case table only
    vlmtrain sweep perf_h200x2 --report                  # results/perf_h200x2.md from the results file
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.lab import sweep_report, vs_bridge
from vlmtrain.lab.kit import experiments, schedule, store
from vlmtrain.lab.kit import spec as spec_module
from vlmtrain.lab.kit.case import Case, placed_resolved
from vlmtrain.lab.kit.runner import ROOT
from vlmtrain.lab.kit.spec import Spec
from vlmtrain.lab.tune import trials

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


def composed(case: Case, **compose_kw: str) -> tuple[RunConfig, Resolved]:
    """The case as `python train.py <case> dry_run=true` composes it, placed on its declared world and resolved."""
    return placed_resolved(case.plus(dry_run=True), **compose_kw)


def table(cases: list[Case], status: dict[str, str] | None = None) -> str:
    """One line per case: the layout and the batch arithmetic (config.resolve's grad-accum)."""
    w = max(len(c.name) for c in cases)
    lines = [f"{'case':<{w}}  {'layout':<12} {'MBS':>3} {'accum':>5}  status"]
    for case in cases:
        run, res = composed(case)
        lay, mbs, accum = res.layout, run.train.micro_batch_size, res.grad_accum
        lines.append(f"{case.name:<{w}}  {f'TP{lay.tp} EP{lay.ep} DP{lay.dp}':<12} {mbs:>3} {accum:>5}  "
                     f"{(status or {}).get(case.name, '')}")
    return "\n".join(lines)


def dry_run(cases: list[Case], out: Path) -> dict[str, str]:
    """What `python train.py <case> dry_run=true` does (preflight, build, Bridge's runtime_config_update for the
    declared world), in this one process so Bridge is imported once."""
    from vlmtrain.build import plan

    status = {}
    for case in cases:
        print(f"\n=== {case.name}: python train.py {' '.join(case.plus(dry_run=True).command_line())}", flush=True)
        rc = plan.dry_run(*composed(case, output_dir=str(out / case.name)))
        status[case.name] = {0: "ok", 2: "PREFLIGHT ERROR", 3: "BRIDGE VALIDATION ERROR"}.get(rc, f"rc={rc}")
    return status


def mock_ratio_row(spec: Spec, ran: set[str], results_path: Path, command: str) -> dict[str, Any] | None:
    """Real vs mock at the same settings (the spec's `mock_pair`), once either side ran now; the other side may
    come from an earlier session's row in the same results file."""
    if not spec.get("mock_pair"):
        return None
    names = tuple(spec.name_of(e) for e in spec.get("mock_pair"))
    latest = sweep_report.latest_rows(results_path)
    real, mock = (latest.get(n) for n in names)
    if not (real and mock and ran & set(names)):
        return None
    r, m = real["metrics"], mock["metrics"]
    metrics = {"real_over_mock_useful_tokens_per_s_per_gpu": r["useful_tokens_per_s_per_gpu"]
               / m["useful_tokens_per_s_per_gpu"], "real_over_mock_step_s": r["step_s"] / m["step_s"]}
    print(f"[sweep] real/mock: {metrics}", flush=True)
    return store.append(results_path, f"real-vs-mock_{names[0]}", command, metrics,
                          config={"real": real["config"], "mock": mock["config"]})


def run_case(case: Case, args: argparse.Namespace, trial_dir: Path | None = None,
             **extra: Any) -> dict[str, Any] | None:
    """One case through the trial runner (no early stopping: every case is measured), its row appended."""
    out = trials.run(trials.sweep_process, trial_dir or args.out / case.name, case, case.gpus or 1)
    if out.status != "ok":
        print(f"[sweep] {case.name}: {out.reason}", flush=True)
    return store.record(case, 0 if out.status == "ok" else 1, Path(out.run_dir), out.wall_s, args.results,
                        config=case.command_line(), runner=args.runner, **extra)


def run(args: argparse.Namespace) -> int:
    """`main` on the spec named (exit 2 for one that is not)."""
    sp = spec_module.for_command(args, "sweep")
    if sp is None:
        return 2
    try:
        return main(sp, args)
    except spec_module.SpecError as e:  # an unknown --sweep or --only: named with the ones there are
        print(f"vlmtrain sweep: {e}", file=sys.stderr)
        return 2


def main(spec: Spec, args: argparse.Namespace) -> int:
    args.results = args.results or ROOT / spec.get("results", f"results/{spec.name}.jsonl")
    args.iterations = args.iterations or int(spec.get("iterations", 8))
    args.repeats = args.repeats or int(spec.get("repeats", 1))
    if args.report:
        md = sweep_report.report(spec, args.results, args.entry + " --report")
        args.results.with_suffix(".md").write_text(md)
        print(md)
        return 0
    if not args.sweep:
        print("vlmtrain sweep: --sweep is required (or --report)", file=sys.stderr)
        return 2
    cases = [c.plus(dry_run=False) for c in spec.expand(args.sweep, args.only, args.iterations)]
    if args.skip_done:
        done = {n for n, r in sweep_report.latest_rows(args.results).items() if not r.get("rc")}
        cases = [c for c in cases if c.name not in done]
    if not cases:
        print("[sweep] no case matches", file=sys.stderr)
        return 2
    case_s = int(spec.get("case_s", 120))
    print(f"[sweep] {len(cases)} case(s) x {args.repeats} run(s), ~{len(cases) * args.repeats * case_s / 60:.0f} min "
          f"of GPU time at ~{case_s} s each")
    if args.list or args.dry_run:  # planned at one iteration, as before any GPU work
        names = {c.name for c in cases}
        planned = [c for c in spec.expand(args.sweep, args.only, 1) if c.name in names]
        status = dry_run(planned, args.out) if args.dry_run else None
        print(("\n" if status else "") + table(planned, status))
        return 0 if all(s == "ok" for s in (status or {}).values()) else 1
    from vlmtrain.config.world import local_gpus

    if local_gpus() < int(spec.get("gpus", 1)):
        print(f"[sweep] needs {spec.get('gpus')} GPUs, this machine has {local_gpus()}: use --dry-run here",
              file=sys.stderr)
        return 2
    args.runner = f"{args.entry} --sweep {' '.join(args.sweep)}"
    machine_run = store.machine_run(args.machine_run, store.machine_runs(args.results))
    repeated = args.repeats > 1
    ran: set[str] = set()

    def measure(case: Case, i: int) -> bool:
        extra = {"machine_run": machine_run, "run": i} if repeated else {}
        row = run_case(case, args, args.out / case.name / f"run{i}" if repeated else None, **extra)
        ran.update([case.name] if row else [])
        return row is not None

    def summarize(case: Case) -> None:
        command = f"{args.runner} --repeats {args.repeats}"
        schedule.summary(args.results, case.name, machine_run, command,
                         vs_bridge.after_summary(args.results, machine_run, command))

    todo = schedule.pending(cases, args.repeats, lambda c: schedule.done(args.results, c.name, machine_run)
                            if repeated else 0, "sweep", machine_run)
    failed = schedule.run(todo, measure, repeats=args.repeats, tag="sweep", machine_run=machine_run,
                          budget_s=args.budget_s, first_s=case_s, after_last=summarize if repeated else None)
    mock_ratio_row(spec, ran, args.results, f"{args.entry} --sweep mock")
    return 1 if failed else 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("spec", help="conf/tune/<spec>.yaml (e.g. perf_h200x2) or a path")
    ap.add_argument("--sweep", nargs="+", help="sweep names of the spec, or all")
    ap.add_argument("--only", nargs="*", help="case names (substring match)")
    ap.add_argument("--iterations", type=int, help="default: the spec's")
    schedule.add_flags(ap, None, "case (default: the spec's `repeats`, else 1)")
    ap.add_argument("--dry-run", action="store_true", help="dry_run=true for every case (CPU: no GPU needed)")
    ap.add_argument("--list", action="store_true", help="print the case table and exit")
    ap.add_argument("--report", action="store_true", help="write <results>.md from --results and exit")
    ap.add_argument("--skip-done", action="store_true",
                    help="leave out cases whose latest row in --results finished (rc 0); failed ones run again")
    experiments.add_results(ap, None, "the spec's results file")
    experiments.add_out(ap, "sweep", stamped=True)
