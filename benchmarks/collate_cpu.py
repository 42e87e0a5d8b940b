"""What one packed H1 row costs the data loader's CPU: rows built by the run's own dataset and collate, one at a time
as one loader worker builds them, median of >= 3 rows with min-max, and the profile's shares of the collate's parts
-> results/collate_cpu.jsonl. CPU only, any machine.

    python benchmarks/collate_cpu.py [--rows 8] [--capacity 12288]

The code is vlmtrain.observe.bench.collate_cpu (its docstring, or --help, says the rest).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.observe.bench.collate_cpu import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
