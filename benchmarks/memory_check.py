"""Validate vlmtrain.check.memory against the peaks measured on the H200: one row per run into
results/memory_estimates.jsonl.

    python benchmarks/memory_check.py [--measured results/gpu_training.jsonl] [--out results/memory_estimates.jsonl]
    python benchmarks/memory_check.py --table     # the markdown table of the written jsonl

The code is vlmtrain.observe.bench.memory_check (its docstring, or --help, says the rest).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.observe.bench.memory_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
