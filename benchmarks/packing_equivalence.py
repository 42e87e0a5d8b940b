"""Packing equivalence on one GPU: each sample alone vs packed in one THD row, with negative controls.

    python benchmarks/packing_equivalence.py [--only CASE ...]   # rows -> results/packing_equivalence.jsonl

The code is vlmtrain.observe.bench.packing_equivalence (its docstring says what is compared and the tolerances).
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vlmtrain.observe.bench.packing_equivalence import CASES, run_cases  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=list(CASES))
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "packing_equivalence.jsonl")
    args = ap.parse_args()
    sys.exit(run_cases(args.only, args.results, os.environ.get("VLMTRAIN_COMMIT", "unknown")))
