"""Issue 23's peer on one H200: Megatron Bridge's own Qwen3-VL-30B-A3B SFT recipe at benchmark H1, through Bridge's
pretrain() and the recipe's forward step, 3 runs on this machine lease + a median row -> results/perf_h200.jsonl.

    python benchmarks/bridge_recipe_h1.py [--repeats 3] [--budget-s S]   # GPU: one torchrun process per run
    python benchmarks/bridge_recipe_h1.py --dry-run                        # CPU: build + Bridge validation only

The code is vlmtrain.observe.bench.bridge_recipe (its docstring, or --help, says what is changed from the recipe).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.observe.bench.bridge_recipe import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(entry=Path(__file__).resolve()))
