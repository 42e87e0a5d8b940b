"""Issue 23.4, the ceiling: bf16 torch.matmul TFLOP/s on this card at 8192^3 and at benchmark H1's GEMM shapes (read
from the model config), median of >= 3 timed repeats with min-max -> results/perf_h200.jsonl. Under a minute on a GPU.

    python benchmarks/matmul_ceiling.py [--repeats 5]   # GPU
    python benchmarks/matmul_ceiling.py --list          # CPU: the shapes only
    python benchmarks/matmul_ceiling.py --towers LEASE  # CPU: that lease's towers-vs-ceiling row again

The code is vlmtrain.observe.bench.ceiling (its docstring, or --help, says the rest).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.observe.bench.ceiling import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
