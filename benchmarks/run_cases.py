"""Run named train.py cases on this GPU node, one row per case in results/<suite>.jsonl.

    python benchmarks/run_cases.py gpu_training [--only NAME ...] [--results results/gpu_training.jsonl]

The code is vlmtrain.observe.bench.cases (its docstring, or --help, says the rest).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.observe.bench.cases import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
