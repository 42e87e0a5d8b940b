"""Issue 23 (H1) and issue 22's packing cases on one H200: conf/tune/perf_h200.yaml -> results/perf_h200.jsonl.

    python benchmarks/perf_h200.py --sweep h1 [--repeats 3] [--budget-s 540] | --sweep all --list | --dry-run | --report

The same as `vlmtrain sweep perf_h200 ...` (vlmtrain.tune.bench: its docstring, or --help, says the rest): each case
runs `repeats` times on this machine lease (runs already recorded are skipped), then its median row.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["sweep", "perf_h200", "--entry", "python benchmarks/perf_h200.py", *sys.argv[1:]]))
