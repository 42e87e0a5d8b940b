"""`vlmtrain overhead <spec>`: the paired A/B measurement of what vlmtrain costs on top of Megatron Bridge, on one
node in one session (vlmtrain overhead perf_h200x2 is its entry point).

    vlmtrain overhead perf_h200x2 [--case SUBSTR] [--pairs 2] [--iterations 20]
    vlmtrain overhead perf_h200x2 --case SUBSTR --pool K   # one row from the pairs of the case's last K rows
    vlmtrain overhead perf_h200x2 --case SUBSTR --pairs 1 --extra train.profile_step=6   # both sides profiled
    vlmtrain overhead perf_h200x2 --dry-run        # CPU: build + Bridge validation of the direct side

Alternating pairs of (a) `python train.py <case>` and (b) torchrun of vlmtrain.lab.bridge_alone: Bridge's
pretrain() on the IDENTICAL ConfigContainer (vlmtrain.lab.overhead: the measurement and side (b)).
Post-warm-up steps of all pairs are pooled: medians, the median of per-step ratios (both sides train the same
samples in the same order) and an interval over pairs. Pairs alternate their order (a b, b a, ...) so that a drift
over the session does not land on one side. Rows `overhead_<case>` go to the spec's results file, one per pair as it
ends and a pooled one; with the spec's iterations, pair 0's (a) run is also recorded as the case's own row. A GPU
job too short for all its pairs runs some, and --pool joins the rows of several invocations on one machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from vlmtrain.lab import bridge_alone as direct_pretrain
from vlmtrain.lab.kit import experiments, runner, store
from vlmtrain.lab.kit import spec as spec_module
from vlmtrain.lab.kit.case import Case, placed_resolved
from vlmtrain.lab.kit.runner import ROOT
from vlmtrain.lab.kit.spec import Spec
from vlmtrain.lab.overhead import (
    ITERATIONS,
    PORT,
    SKIP,
    direct_command,
    direct_run_config,
    overhead_metrics,
    pair_record,
    profiled_iterations,
    run_direct,
)


def pick(spec: Spec, name: str, iterations: int) -> Case:
    """The spec's case of that exact name, else the first whose name contains it."""
    cases = [c.plus(dry_run=False) for c in spec.expand(["all"], [name], iterations)]
    if not cases:
        raise SystemExit(f"no {spec.name} case matches {name!r}")
    return next((c for c in cases if c.name == name), cases[0])


def dry_run(case: Case, out: Path) -> int:
    """CPU check of side (b): save the run config as launch.local would, derive (b)'s, then load/build/validate."""
    from vlmtrain.launch import local

    run, res = placed_resolved(case, output_dir=str(out / "vlmtrain"))
    run_config = direct_run_config(local.save_run_config(run, res), out / "direct")
    print("(a)", " ".join(runner.argv(case, out / "pairN_vlmtrain")))
    print("(b)", " ".join(direct_command(run_config, case.gpus, PORT)))
    return direct_pretrain.main([str(run_config), "--dry-run"])


def run_pair(case: Case, i: int, args: argparse.Namespace) -> dict[str, Any] | None:
    """Pair i: (a) then (b) for even i, (b) then (a) for odd i; (b) runs on pair 0's (a) run config (the same
    overrides composed once; pair 0 runs (a) first). None (with the failing log's tail on stderr) when a run fails."""
    a_case = dataclasses.replace(case, name=f"pair{i}_vlmtrain")
    b_dir = args.out / f"pair{i}_direct"
    source = args.out / "pair0_vlmtrain" / "run_config.yaml"
    order = "direct,vlmtrain" if i % 2 else "vlmtrain,direct"
    walls: dict[str, float] = {}
    for side in order.split(","):
        if side == "vlmtrain":
            [(_, rc, a_dir, walls[side])] = runner.side_by_side([a_case], args.out)
            log = a_dir / "train.log"
            if not rc and i == 0 and args.iterations == int(args.spec.get("iterations", 8)) and not args.extra:
                store.record(case, rc, a_dir, walls[side], args.results, config=case.command_line(),
                                 runner=f"{args.entry} --case {case.name} (pair 0, vlmtrain side)")
        else:
            rc, walls[side] = run_direct(source, b_dir, case.gpus)
            log = b_dir / "train.log"
        if rc:
            print(log.read_text()[-4000:], file=sys.stderr)
            return None
    pair = pair_record(a_dir, b_dir, walls["vlmtrain"], walls["direct"], args.skip, order,
                       profiled_iterations(case.overrides), args.profile_summary)
    if not (pair["vlmtrain_log_ms"] and pair["direct_log_ms"]):
        print(f"[overhead] pair {i}: no Bridge step line after iteration {args.skip} in {a_dir} or {b_dir}",
              file=sys.stderr)
        return None
    return pair


def pool(name: str, k: int, results_path: Path, command: str) -> dict[str, Any]:
    """One row from the pairs of the last k rows named `name` (invocations of one session on one machine: same
    date, machine and config, else refused), so a session split into several commands gives one measurement."""
    rows = [r for r in store.read(results_path) if r["name"] == name and "pairs_detail" in r
            and "pooled" not in r][-k:]
    if len(rows) < k or len({(r["date"], r["machine"], str(r.get("config"))) for r in rows}) != 1:
        raise SystemExit(f"--pool {k}: need {k} rows of {name} from one date, machine and config in "
                         f"{results_path}, found {[(r['date'], r['machine']) for r in rows]}")
    pairs = [p for r in rows for p in r["pairs_detail"]]
    kept = {k: v for k, v in rows[-1].items() if k not in ("name", "command", "metrics", "pairs_detail")}
    return store.append(results_path, name, command, overhead_metrics(pairs), **kept, pairs_detail=pairs,
                        pooled=[r["command"] for r in rows])


def profile_summary(run_dir: Path) -> dict[str, Any] | None:
    """A side's traced step (vlmtrain.report.profile), None when it traced none."""
    from vlmtrain.report import profile

    return profile.summarize(run_dir) if (run_dir / profile.TRACE).exists() else None


def run(args: argparse.Namespace) -> int:
    """`main` on the spec named (exit 2 for one that is not)."""
    sp = spec_module.for_command(args, "overhead")
    return 2 if sp is None else main(sp, args)


def main(spec: Spec, args: argparse.Namespace) -> int:
    args.profile_summary = profile_summary
    args.spec, args.results = spec, args.results or ROOT / spec.get("results", f"results/{spec.name}.jsonl")
    case = pick(spec, args.case or spec.name_of({}), args.iterations)
    cmd = f"{args.entry} --case {case.name}"
    if args.extra:
        cmd += " --extra " + " ".join(args.extra)
        case = dataclasses.replace(case, name="+".join([case.name, *args.extra]),
                                   overrides=[*case.overrides, *args.extra])
    name = f"overhead_{case.name}"
    if args.pool:
        print(f"[overhead] {pool(name, args.pool, args.results, f'{cmd} --pool {args.pool}')['metrics']}")
        return 0
    print(f"[overhead] {case.name}: {args.pairs} pair(s) of {args.iterations} iterations, skip {args.skip}")
    if args.dry_run:
        return dry_run(case, args.out)

    cmd += f" --pairs {args.pairs} --iterations {args.iterations}"
    for i in range(args.pairs):
        pair = run_pair(case, i, args)
        if pair is None:
            return 1
        # one row per pair as it finishes (a command cut short keeps its pairs); the last one pools them
        metrics = overhead_metrics([pair])
        store.append(args.results, name, f"{cmd} (pair {i})", metrics, config=case.command_line(),
                       direct=" ".join(direct_command(Path("<run dir>/run_config.yaml"), case.gpus, PORT)),
                       pairs_detail=[pair])
        print(f"[overhead] pair {i} ({pair['order']}): {metrics}", flush=True)
    print(f"[overhead] {pool(name, args.pairs, args.results, cmd)['metrics']}")
    return 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("spec", help="conf/tune/<spec>.yaml (e.g. perf_h200x2) or a path")
    ap.add_argument("--case", help="case name of the spec (substring; default: its defaults' case)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=ITERATIONS)
    ap.add_argument("--skip", type=int, default=SKIP, help="warm-up iterations left out")
    ap.add_argument("--extra", nargs="*", default=[], help="overrides added to the case on both sides; they name "
                    "the row apart (e.g. train.profile_step=6: both sides trace that step)")
    ap.add_argument("--pool", type=int, metavar="K", help="no runs: pool the pairs of the case's last K rows")
    ap.add_argument("--dry-run", action="store_true", help="CPU: build + Bridge validation of the direct side")
    experiments.add_results(ap, None, "the spec's results file")
    experiments.add_out(ap, "overhead", stamped=True)
