"""The GPU reliability checks of issue 25 (secrets in a real run's checkpoint dir, NaN stop and skip, OOM record,
kill -9 mid-checkpoint) on one GPU; one row per check in results/reliability.jsonl (vlmtrain.lab.checks.reliability
says what each does). A check that raises still writes its row, with the reason.

    python -m vlmtrain.lab.checks.reliability_check [--only secrets,oom] [--out outputs/reliability]
    python -m vlmtrain.lab.checks.reliability_check --only kill_ckpt_3d,kill_ckpt_3d_async    # ~3-4 min on one H200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vlmtrain.lab import store
from vlmtrain.lab.checks.reliability import CHECKS
from vlmtrain.lab.runner import ROOT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(CHECKS))
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "reliability")
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "reliability.jsonl")
    a = ap.parse_args()
    names = a.only.split(",")
    if unknown := [n for n in names if n not in CHECKS]:
        ap.error(f"unknown check(s) {unknown}: --only takes a comma-separated list of {', '.join(CHECKS)}")
    ok = True
    for name in names:
        print(f"[reliability] {name} ...", flush=True)
        try:
            passed, metrics, cmd = CHECKS[name](a.out)
        except Exception as e:  # noqa: BLE001 - a failing check is a row with its reason, not a crash without one
            passed, metrics, cmd = False, {"reason": f"{type(e).__name__}: {e}"}, "(the check raised before its run)"
        store.append(a.results, f"reliability_{name}_tiny_1gpu", cmd, {**metrics, "passed": passed},
                       runner=f"python -m vlmtrain.lab.checks.reliability_check --only {name}")
        print(json.dumps({"check": name, "passed": passed, **metrics}, default=str), flush=True)
        ok &= passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
