"""One torchrun rank of overhead.py's "Bridge alone" side.

    python benchmarks/direct_pretrain.py <run_config.yaml> [--dry-run]

The code is vlmtrain.observe.bench.direct (its docstring, or --help, says the rest).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.observe.bench.direct import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
