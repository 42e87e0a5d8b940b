"""Issue 9: the 2 x H200 performance sweeps (conf/tune/perf_h200x2.yaml) -> results/perf_h200x2.jsonl.

    python benchmarks/perf_h200x2.py --sweep mbs parallelism [--only SUBSTR ...] | --sweep all --list | --report

The same as `vlmtrain sweep perf_h200x2 ...` (vlmtrain.tune.bench: its docstring, or --help, says the rest).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["sweep", "perf_h200x2", "--entry", "python benchmarks/perf_h200x2.py", *sys.argv[1:]]))
