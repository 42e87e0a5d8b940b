"""The cross-entropy phase's memory per logit (kernels.cross_entropy=native|te) at one H1 row, through Megatron's own
loss calls, median of 3 with min-max -> results/logits_memory_h200.jsonl: what the memory estimate's LOGITS_BYTES
assumes.

    python benchmarks/logits_memory.py      # GPU, ~20 s

The code is vlmtrain.observe.bench.logits_memory (its docstring, or --help, says the rest).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.observe.bench.logits_memory import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
