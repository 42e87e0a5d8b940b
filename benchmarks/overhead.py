"""Issue 9.3: vlmtrain vs Bridge's pretrain() alone on the identical ConfigContainer (conf/tune/perf_h200x2.yaml cases).

    python benchmarks/overhead.py [--case SUBSTR] [--pairs 2] [--iterations 20] [--pool K] [--dry-run]

The same as `vlmtrain overhead perf_h200x2 ...` (vlmtrain.tune.ab: its docstring, or --help, says the rest).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["overhead", "perf_h200x2", "--entry", "python benchmarks/overhead.py", *sys.argv[1:]]))
